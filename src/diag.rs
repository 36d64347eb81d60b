//! Messages to the user on stderr that can never fail the run. A profiler's status and
//! summary lines are a courtesy: when stderr is closed, full (`2>/dev/full`) or a pipe
//! whose reader left (`2>&1 | head -1`), the lines are dropped and the recording goes
//! on. `eprintln!` would panic there instead and leave a partial profile behind.

/// Like `eprintln!`, but a failed write is ignored instead of panicking.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr().lock(), $($arg)*);
    }};
}

/// Like `eprint!` (no newline, flushed), but a failed write is ignored.
#[macro_export]
macro_rules! say_partial {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let mut err = ::std::io::stderr().lock();
        let _ = ::std::write!(err, $($arg)*);
        let _ = err.flush();
    }};
}
