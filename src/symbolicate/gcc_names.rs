//! GCC's older mangling of a qualified name in a template argument, which cpp_demangle
//! rejects: `sr <type> <name>` (`wi::int_traits<T>::precision_type` as
//! `srNS_10int_traitsIT_EE14precision_type`, `std::is_enum<T>::value` as
//! `srSt7is_enumIT_E5value`). The current Itanium ABI allows only a template parameter,
//! a decltype or a back-reference there, and reads the other characters as a list of
//! names that are no substitution candidates, while GCC, which mangled a type, made the
//! type, its template name and its arguments candidates: every later back-reference
//! (`S8_`) past them then means another thing, or nothing, to cpp_demangle.
//!
//! [`rewrite`] spells each such expression as the member access `dt cv <type> _ E
//! <name>` (the member `name` of a value of the type): there the type is parsed as a type,
//! with exactly the candidates GCC made of it, so every back-reference keeps its meaning.
//! The member's name carries a mark, and [`restore`] turns the printed `(Type()).name`
//! back into `Type::name`. Only names cpp_demangle rejects are rewritten.

/// Longer names are not rewritten: real names of this kind are a few hundred bytes to a
/// few kilobytes.
const MAX_NAME_BYTES: usize = 8192;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok {
    /// A substitution back-reference (`S_`, `S4_`).
    Ref,
    /// A literal or a number: nothing the rewrite looks into.
    Opaque,
    /// A template parameter (`T_`, `T0_`).
    Param,
    /// A length-prefixed source name.
    Name,
    /// The `sr` operator.
    Sr,
    /// Any other single character.
    Char(u8),
}

#[derive(Clone, Copy, Debug)]
struct Token {
    start: usize,
    end: usize,
    tok: Tok,
}

/// Splits a mangled name into the tokens the rewrite needs; `None` for what it does not
/// know how to split (special names, unusual literals, damaged names).
fn tokens(s: &[u8]) -> Option<Vec<Token>> {
    let mut out = Vec::new();
    let mut i = match s.get(..3)? {
        b"_ZL" => 3,
        [b'_', b'Z', c] if *c != b'T' => 2,
        _ => return None,
    };
    let digits_end =
        |from: usize| from + s[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    // Up to the `_` that ends a sequence id (`S12_`, `T0_`): digits and capitals.
    let seq_end = |from: usize| -> Option<usize> {
        let len = s.get(from..)?.iter().position(|&c| c == b'_')?;
        s[from..from + len]
            .iter()
            .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase())
            .then_some(from + len + 1)
    };
    while i < s.len() {
        let start = i;
        let c = s[i];
        let tok = match c {
            b'0'..=b'9' => {
                let end = digits_end(i);
                // A number, not a name's length, after a discriminator's `_`, an array's
                // `A`, a vector's `Dv`, an unnamed type's `Ut` or a parameter's `fp`. (The
                // tokens, not the bytes: `T_` or `S_` before a name ends with `_` too.)
                let last = |n: usize| {
                    out.len()
                        .checked_sub(n)
                        .and_then(|k| out.get(k))
                        .map(|t: &Token| t.tok)
                };
                let counted = match (last(2), last(1)) {
                    (_, Some(Tok::Char(b'_' | b'A'))) => true,
                    (Some(Tok::Char(a)), Some(Tok::Char(b))) => {
                        matches!((a, b), (b'D', b'v') | (b'U', b't') | (b'f', b'p'))
                    }
                    _ => false,
                };
                if counted && s.get(end) == Some(&b'_') {
                    i = end + 1;
                    Tok::Opaque
                } else {
                    let len: usize = std::str::from_utf8(&s[i..end]).ok()?.parse().ok()?;
                    i = end.checked_add(len).filter(|&e| e <= s.len())?;
                    Tok::Name
                }
            }
            b'S' => match *s.get(i + 1)? {
                n if n.is_ascii_lowercase() => {
                    i += 2;
                    Tok::Char(b'S')
                }
                _ => {
                    i = seq_end(i + 1)?;
                    Tok::Ref
                }
            },
            b'T' => {
                i = seq_end(i + 1)?;
                Tok::Param
            }
            b'L' => match *s.get(i + 1)? {
                b'_' if s.get(i + 2) == Some(&b'Z') => {
                    i += 3;
                    Tok::Char(b'L')
                }
                n if n.is_ascii_lowercase() => {
                    let value = s.get(i + 2..)?;
                    let len = value.iter().position(|&c| c == b'E')?;
                    if !value[..len].iter().all(u8::is_ascii_alphanumeric) {
                        return None;
                    }
                    i += 2 + len + 1;
                    Tok::Opaque
                }
                _ => return None,
            },
            b's' if s.get(i + 1) == Some(&b'r') => {
                i += 2;
                Tok::Sr
            }
            // A clone suffix (`.isra.0`): not mangled.
            b'.' => break,
            _ => {
                i += 1;
                Tok::Char(c)
            }
        };
        out.push(Token { start, end: i, tok });
    }
    Some(out)
}

/// The token after the type that starts at token `j`, in GCC's form: a nested name
/// (`N…E`), or a class name (`15poly_int_traits`, `St11is_function`, a back-reference)
/// with optional template arguments. `None` for anything else, and for a template
/// parameter or a bare back-reference, which both forms spell alike.
fn gcc_type(tokens: &[Token], j: usize) -> Option<usize> {
    let balanced = |from: usize| -> Option<usize> {
        let mut depth = 0usize;
        for (k, t) in tokens.iter().enumerate().skip(from) {
            match t.tok {
                Tok::Char(b'N' | b'I' | b'J' | b'X') => depth += 1,
                Tok::Char(b'E') => {
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        return Some(k + 1);
                    }
                }
                _ => {}
            }
        }
        None
    };
    let with_arguments = |k: usize| match tokens.get(k).map(|t| t.tok) {
        Some(Tok::Char(b'I')) => balanced(k),
        _ => Some(k),
    };
    match tokens.get(j)?.tok {
        Tok::Char(b'N') => balanced(j),
        Tok::Name => with_arguments(j + 1),
        // `St` qualifies the name after it; `Sa`, `Sb` are template names themselves.
        Tok::Char(b'S') if tokens.get(j + 1)?.tok == Tok::Name => with_arguments(j + 2),
        Tok::Char(b'S') | Tok::Ref if tokens.get(j + 1)?.tok == Tok::Char(b'I') => balanced(j + 1),
        _ => None,
    }
}

/// Marks the member name of a rewritten expression, so that its printed form can be
/// found and put back as `Type::name`. Source names are no substitution candidates in
/// a member access, so a longer one changes nothing else.
const MARK: &str = "__sampler_gcc_scope__";

/// `name` with each `sr <type> <name>` in GCC's form rewritten as a member access of a
/// value of that type (`dt cv <type> _ E <name>`), which makes exactly the substitution
/// candidates GCC made of the type; the member's name carries [`MARK`]. `None` when the
/// name has no such expression.
pub fn rewrite(name: &str) -> Option<String> {
    // Tokens are bytes; mangled names are ASCII.
    if !name.is_ascii() || name.len() > MAX_NAME_BYTES {
        return None;
    }
    let tokens = tokens(name.as_bytes())?;
    let mut out = String::with_capacity(name.len() + 64);
    // The prefix (`_Z`, `_ZL`), which is no token.
    out.push_str(&name[..tokens.first()?.start]);
    let mut rewritten = 0;
    respell(name, &tokens, 0..tokens.len(), &mut out, &mut rewritten);
    if rewritten == 0 || rewritten > MAX_REWRITES {
        return None;
    }
    // What follows the last token (a clone suffix) stays as it is.
    out.push_str(&name[tokens.last()?.end..]);
    Some(out)
}

/// Appends the bytes of `range` of the tokens to `out`, each expression in GCC's form
/// (also one inside another's type) rewritten; counts the rewrites.
fn respell(
    name: &str,
    tokens: &[Token],
    range: std::ops::Range<usize>,
    out: &mut String,
    rewritten: &mut usize,
) {
    let mut t = range.start;
    while t < range.end {
        let token = tokens[t];
        let expression = (token.tok == Tok::Sr)
            .then(|| gcc_type(tokens, t + 1))
            .flatten()
            .filter(|&after| after < range.end && tokens[after].tok == Tok::Name);
        let Some(after) = expression else {
            out.push_str(&name[token.start..token.end]);
            t += 1;
            continue;
        };
        let member = tokens[after];
        let source =
            name[member.start..member.end].trim_start_matches(|c: char| c.is_ascii_digit());
        out.push_str("dtcv");
        respell(name, tokens, t + 1..after, out, rewritten);
        out.push_str(&format!("_E{}{MARK}{source}", MARK.len() + source.len()));
        *rewritten += 1;
        t = after + 1;
    }
}

/// The demangled form of a [`rewrite`]: each `(Type()).MARKname` put back as
/// `Type::name`. `None` if a mark is not where the rewrite puts it.
pub fn restore(demangled: &str) -> Option<String> {
    let suffix = format!(")).{MARK}");
    let mut text = demangled.to_string();
    while let Some(end) = text.find(&suffix) {
        // The parenthesis that opens `(Type())`, before the value's own `()`.
        let close = end + 1;
        let mut depth = 0usize;
        let mut open = None;
        for (i, c) in text[..=close].char_indices().rev() {
            match c {
                ')' => depth += 1,
                '(' => {
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        open = Some(i);
                        break;
                    }
                }
                _ => {}
            }
        }
        let open = open?;
        let ty = text.get(open + 1..end - 1)?.to_string();
        text.replace_range(open..end + suffix.len(), &format!("{ty}::"));
    }
    (!text.contains(MARK)).then_some(text)
}

/// At most this many expressions are rewritten in one name: real names have a few.
const MAX_REWRITES: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbolicate::demangle;

    fn parses(name: &str) -> bool {
        cpp_demangle::Symbol::new(name).is_ok()
    }

    #[test]
    fn a_nested_type_and_a_back_reference_to_it() {
        // `S8_` is the type `wi::int_traits<…>` of the first expression: GCC's ninth
        // candidate, which cpp_demangle does not have in the name as it is.
        let name = "_ZN2wi3absI16generic_wide_intI20wide_int_ref_storageILb0ELb0EEEEENS_13binary_traitsIT_S6_XsrNS_10int_traitsIS6_EE14precision_typeEXsrS8_14precision_typeEE11result_typeERKS6_";
        assert!(!parses(name));
        // The second expression is a back-reference, the same in both forms.
        assert_eq!(
            rewrite(name).unwrap(),
            "_ZN2wi3absI16generic_wide_intI20wide_int_ref_storageILb0ELb0EEEEENS_13binary_traitsIT_S6_XdtcvNS_10int_traitsIS6_EE_E35__sampler_gcc_scope__precision_typeEXsrS8_14precision_typeEE11result_typeERKS6_"
        );
        // As c++filt says.
        assert_eq!(
            demangle(name),
            "wi::binary_traits<generic_wide_int<wide_int_ref_storage<false, false> >, generic_wide_int<wide_int_ref_storage<false, false> >, wi::int_traits<generic_wide_int<wide_int_ref_storage<false, false> > >::precision_type, wi::int_traits<generic_wide_int<wide_int_ref_storage<false, false> > >::precision_type>::result_type wi::abs<generic_wide_int<wide_int_ref_storage<false, false> > >(generic_wide_int<wide_int_ref_storage<false, false> > const&)"
        );
    }

    #[test]
    fn a_template_name_reused_with_other_arguments() {
        // The second expression's `NS7_IS6_EE` is `wi::int_traits` (the first one's
        // template name) with other arguments.
        let name = "_ZN2wi3addI16generic_wide_intI16wide_int_storageES3_EENS_13binary_traitsIT_T0_XsrNS_10int_traitsIS5_EE14precision_typeEXsrNS7_IS6_EE14precision_typeEE11result_typeERKS5_RKS6_6signopPNS_13overflow_typeE";
        assert_eq!(
            demangle(name),
            "wi::binary_traits<generic_wide_int<wide_int_storage>, generic_wide_int<wide_int_storage>, wi::int_traits<generic_wide_int<wide_int_storage> >::precision_type, wi::int_traits<generic_wide_int<wide_int_storage> >::precision_type>::result_type wi::add<generic_wide_int<wide_int_storage>, generic_wide_int<wide_int_storage> >(generic_wide_int<wide_int_storage> const&, generic_wide_int<wide_int_storage> const&, signop, wi::overflow_type*)"
        );
    }

    #[test]
    fn a_plain_class_name_and_later_references() {
        // `sr15poly_int_traitsIS1_E7is_poly`: GCC's two candidates (the template name
        // and the type) come before the later `S6_` (`poly_int_pod`).
        let name = "_Z10multiple_pILj1ElilEN10if_nonpolyIT1_bXsr15poly_int_traitsIS1_E7is_polyEE4typeERK12poly_int_podIXT_ET0_ES1_PS6_IXT_ET2_E";
        // c++filt writes the literal `1u`.
        assert_eq!(
            demangle(name),
            "if_nonpoly<int, bool, poly_int_traits<int>::is_poly>::type multiple_p<(unsigned int)1, long, int, long>(poly_int_pod<(unsigned int)1, long> const&, int, poly_int_pod<(unsigned int)1, long>*)"
        );
    }

    #[test]
    fn types_whose_arguments_make_candidates_of_their_own() {
        // V8's: three expressions; `S7_` after them is `signed char const*`, counted
        // among the candidates of the first expression's arguments. c++filt prints the
        // same with fewer parentheses.
        let name = "_ZN2v84base17PrintCheckOperandIPKaEENSt9enable_ifIXaaaantsrSt11is_functionINSt14remove_pointerIT_E4typeEE5valuentsrSt7is_enumIS7_E5valuesrNS0_19has_output_operatorIS7_NS0_18CheckMessageStreamEvEE5valueENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEE4typeES7_";
        assert_eq!(
            demangle(name),
            "std::enable_if<((!(std::is_function<std::remove_pointer<signed char const*>::type>::value))&&(!(std::is_enum<signed char const*>::value)))&&(v8::base::has_output_operator<signed char const*, v8::base::CheckMessageStream, void>::value), std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > >::type v8::base::PrintCheckOperand<signed char const*>(signed char const*)"
        );
        // libstdc++'s: a member whose name starts with `_`, after an `E`.
        let name = "_ZSt14__copy_move_a1ILb0EPbbEN9__gnu_cxx11__enable_ifIXsrSt23__is_random_access_iterIT0_NSt15iterator_traitsIS4_E17iterator_categoryEE7__valueESt15_Deque_iteratorIT1_RSA_PSA_EE6__typeES4_S4_SD_";
        assert_eq!(
            demangle(name),
            "__gnu_cxx::__enable_if<std::__is_random_access_iter<bool*, std::iterator_traits<bool*>::iterator_category>::__value, std::_Deque_iterator<bool, bool&, bool*> >::__type std::__copy_move_a1<false, bool*, bool>(bool*, bool*, std::_Deque_iterator<bool, bool&, bool*>)"
        );
    }

    #[test]
    fn restore_puts_nested_types_back() {
        let m = MARK;
        assert_eq!(
            restore(&format!("f<(A<(B()).{m}x, C(int)>()).{m}y>()")).unwrap(),
            "f<A<B::x, C(int)>::y>()"
        );
        assert_eq!(restore("f<(A()).value>()").unwrap(), "f<(A()).value>()");
        assert_eq!(restore(&format!("f<A()).{m}y>")), None, "unbalanced");
        assert_eq!(restore(&format!("f<{m}y>")), None, "a mark elsewhere");
    }

    #[test]
    fn damaged_names_do_not_panic() {
        let names = [
            "_ZN2wi3addI16generic_wide_intI16wide_int_storageES3_EENS_13binary_traitsIT_T0_XsrNS_10int_traitsIS5_EE14precision_typeEXsrNS7_IS6_EE14precision_typeEE11result_typeERKS5_RKS6_6signopPNS_13overflow_typeE",
            "_Z10multiple_pILj1ElilEN10if_nonpolyIT1_bXsr15poly_int_traitsIS1_E7is_polyEE4typeERK12poly_int_podIXT_ET0_ES1_PS6_IXT_ET2_E",
            "_ZN2v84base17PrintCheckOperandIPKaEENSt9enable_ifIXaaaantsrSt11is_functionINSt14remove_pointerIT_E4typeEE5valuentsrSt7is_enumIS7_E5valuesrNS0_19has_output_operatorIS7_NS0_18CheckMessageStreamEvEE5valueENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEE4typeES7_",
        ];
        for name in names {
            for at in 0..name.len() {
                let _ = demangle(&name[..at]);
                for c in ['E', 'I', 'N', 'S', 'T', 'L', '_', '0', '9', 'r', 's', 'Z'] {
                    let mut damaged = name.to_string();
                    damaged.replace_range(at..at + 1, c.encode_utf8(&mut [0; 4]));
                    let _ = demangle(&damaged);
                }
            }
        }
    }

    #[test]
    fn other_names_are_left_alone() {
        assert_eq!(rewrite("_ZN3foo3barEv"), None, "no sr");
        assert_eq!(rewrite("_Z1fIiEN1AIXsrT_1xEE1tEv"), None, "current form");
        assert_eq!(rewrite("_ZN2wi3absIXsrNS_"), None, "cut short");
        assert_eq!(rewrite("_Z1fIXsr3ab\u{e9}E"), None, "not ASCII");
        // `_ZN1AIT_11_Rb_tree` : a name after a parameter is a name, not a number.
        let t = tokens(b"_Z1fIT_11_Rb_tree_nodeE").unwrap();
        assert!(t
            .iter()
            .any(|t| t.tok == Tok::Name && t.end - t.start == 13));
    }
}
