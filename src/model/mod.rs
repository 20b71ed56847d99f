//! Model configuration (an enum of architectures), weight views into the mmap and the forward
//! pass, written once.

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{0}")]
    Todo(String),
}
