//! A program's entry stub: the dynamic loader's `_start`, or a program's own, is a few
//! instructions without CFI whose calls never return, so a return address just after one
//! of those calls is the outermost frame of a stack. [`entry_stub_returns`] finds them
//! when a file is opened, by decoding its entry point's first instructions; the unwinder
//! stops there instead of reading past the stack's end.

use iced_x86::{Decoder, DecoderOptions, FlowControl};

/// The return addresses of the calls that the entry stub at `entry` (the bytes from it
/// on) makes before it jumps away or stops: the code runs from the entry point on, so
/// nothing returns past it, and a frame at one of these return addresses is the outermost
/// one. The dynamic loader's `_start` calls `_dl_start`, then `_dl_init` (the libraries'
/// constructors), then jumps to the program's entry; a program's `_start` calls
/// `__libc_start_main` and halts.
pub fn entry_stub_returns(code: &[u8], entry: u64) -> Vec<u64> {
    /// The loader's stub is 16 instructions up to its jump; static and PIE `_start`s about
    /// a dozen up to their `hlt`.
    const ENTRY_INSTRUCTIONS: usize = 32;
    let mut decoder = Decoder::with_ip(64, code, entry, DecoderOptions::NONE);
    let mut returns = Vec::new();
    for _ in 0..ENTRY_INSTRUCTIONS {
        if !decoder.can_decode() {
            break;
        }
        let insn = decoder.decode();
        match insn.flow_control() {
            FlowControl::Call | FlowControl::IndirectCall => returns.push(insn.next_ip()),
            FlowControl::Next => {}
            _ => break,
        }
    }
    returns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_stub_call() {
        // The dynamic loader's _start: mov %rsp,%rdi; call _dl_start; mov %rax,%r12;
        // call *%rax; jmp *%r12; then another function's code.
        let code = [
            0x48, 0x89, 0xe7, 0xe8, 0x78, 0x0c, 0x00, 0x00, 0x49, 0x89, 0xc4, 0xff, 0xd0, 0x41,
            0xff, 0xe4, 0xe8, 0, 0, 0, 0,
        ];
        assert_eq!(entry_stub_returns(&code, 0x1000), vec![0x1008, 0x100d]);
        assert!(entry_stub_returns(&[0xc3], 0x1000).is_empty());
    }
}
