//! `hob convert`. STUB: the import/convert worker fills it in.

use super::ConvertArgs;

pub fn run(args: &ConvertArgs) -> crate::Result<()> {
    todo!("{args:?}")
}
