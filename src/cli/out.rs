//! Standard output of every command, through one path: a reader that goes away early
//! (`hob inspect m.hob | head -1`) is a normal end of the command (exit 0, as for `rg | head`);
//! any other failure to write ends it with an error.

use std::io::Write;

/// Write `args` to stdout and flush (a pipe shows progress as it comes).
pub fn write(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        end(e);
    }
}

/// The end of the command on a failed write to stdout.
pub fn end(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: <stdout>: write: {e}");
    std::process::exit(1);
}

/// `print!` through [`write`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::cli::out::write(format_args!($($arg)*)) };
}

/// `println!` through [`write`].
macro_rules! outln {
    () => { $crate::cli::out::write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::cli::out::write(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {out, outln};
