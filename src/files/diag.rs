//! Messages to the user on stderr that can never fail the run, and text made safe for a
//! terminal.
//!
//! A profiler's status and summary lines are a courtesy: when stderr is closed, full
//! (`2>/dev/full`) or a pipe whose reader left (`2>&1 | head -1`), the lines are dropped
//! and the recording goes on. `eprintln!` would panic there instead and leave a partial
//! profile behind.
//!
//! Names in a profile are chosen by the programs profiled (symbol, thread, file and
//! library names) and may hold control characters: ESC and BEL sequences that, reaching a
//! terminal raw, set its title, clear the screen or fake output. Whatever sampler prints
//! to a terminal passes through [`terminal_safe`]; a pipe or a file gets the text as it is.

use std::borrow::Cow;

/// Like `eprintln!`, but a failed write is ignored instead of panicking, and control
/// characters are shown escaped when stderr is a terminal.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        $crate::files::diag::say_text(&::std::format!("{}\n", ::std::format_args!($($arg)*)));
    }};
}

/// Like `eprint!` (no newline, flushed), but a failed write is ignored.
#[macro_export]
macro_rules! say_partial {
    ($($arg:tt)*) => {{
        $crate::files::diag::say_text(&::std::format!($($arg)*));
    }};
}

/// Writes `text` to stderr, escaped when stderr is a terminal; a failed write is ignored.
pub fn say_text(text: &str) {
    use std::io::{IsTerminal, Write};
    let mut err = std::io::stderr().lock();
    let text = match err.is_terminal() {
        true => terminal_safe(text),
        false => Cow::Borrowed(text),
    };
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}

/// Whether `c` changes what a terminal does rather than showing a character: the C0
/// controls but line feed and tab (which lay out sampler's own text), DEL, and the C1
/// controls (U+0080 to U+009F; `U+009B` alone starts a control sequence in many
/// terminals).
fn is_terminal_control(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// `text` with every terminal control character (see `is_terminal_control`) written
/// as a visible escape, `\x1b` or `\u{9b}`, so that a name shows what it holds and does
/// nothing to the terminal.
pub fn terminal_safe(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_terminal_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            c if !is_terminal_control(c) => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_not_obeyed() {
        assert_eq!(
            terminal_safe("main\x1b]0;pwned\x07 hot\u{9b}2J\x7f"),
            "main\\x1b]0;pwned\\x07 hot\\u{9b}2J\\x7f"
        );
        assert!(matches!(
            terminal_safe("a;b\tc\n"),
            Cow::Borrowed("a;b\tc\n")
        ));
        assert_eq!(terminal_safe("über\r"), "über\\x0d");
    }
}
