//! QEMU's option syntax (`QemuOpts`: `value,key=value,key=value`), built from typed parts.
//!
//! Only the options that accept nothing else use it (`-name`, `-chardev`, `-mon`): `-device` and
//! `-blockdev` are passed as JSON (QEMU 10 accepts both), where no string can become a key.
//!
//! # Guarantees
//! Keys are `&'static str` chosen by this crate; a value is escaped the way QEMU unescapes it
//! (a comma is doubled, nothing else is special after the first `=`), so any string, commas
//! included, comes back as exactly one value of exactly the key it was set for. [`parse`] is
//! QEMU's own rule, for the tests that prove it.

/// One option argument under construction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Opts(String);

impl Opts {
    /// An argument whose first element is `value` for QEMU's implied key (`-chardev socket`).
    /// Only a constant: QEMU reads an implied value with an `=` in it as a key.
    #[must_use]
    pub fn implied(value: &'static str) -> Self {
        debug_assert!(!value.contains([',', '=']), "implied values are this crate's own");
        Opts(value.to_owned())
    }

    /// An argument that starts with a `key=value` element.
    #[must_use]
    pub fn new() -> Self {
        Opts(String::new())
    }

    /// Appends `key=value`.
    #[must_use]
    pub fn set(mut self, key: &'static str, value: &str) -> Self {
        debug_assert!(!key.is_empty() && !key.contains([',', '=']), "option keys are this crate's own");
        if !self.0.is_empty() {
            self.0.push(',');
        }
        self.0.push_str(key);
        self.0.push('=');
        self.0.push_str(&escape(value));
        self
    }

    /// The argument as QEMU reads it.
    #[must_use]
    pub fn build(self) -> String {
        self.0
    }
}

/// QEMU's only escape in option values: a comma is written twice.
#[must_use]
pub fn escape(value: &str) -> String {
    value.replace(',', ",,")
}

/// Splits an option argument as QEMU's `QemuOpts` parser does: elements end at a single comma
/// (a doubled comma is a literal one); an element without `=` is the implied key's value
/// (returned with key `None`). For tests and the fuzz target.
#[must_use]
pub fn parse(arg: &str) -> Vec<(Option<String>, String)> {
    let mut out = Vec::new();
    let mut rest = arg;
    loop {
        // The name: up to '=' or ','. QEMU does not unescape names.
        let name_end = rest.find(['=', ',']).unwrap_or(rest.len());
        let (key, value_start) =
            if rest[name_end..].starts_with('=') { (Some(rest[..name_end].to_owned()), name_end + 1) } else { (None, 0) };
        let mut value = String::new();
        let mut chars = rest[value_start..].char_indices().peekable();
        let mut consumed = rest.len();
        while let Some((i, c)) = chars.next() {
            if c == ',' {
                if chars.peek().is_some_and(|(_, n)| *n == ',') {
                    chars.next();
                    value.push(',');
                    continue;
                }
                consumed = value_start + i + 1;
                break;
            }
            value.push(c);
        }
        out.push((key, value));
        if consumed >= rest.len() {
            return out;
        }
        rest = &rest[consumed..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comma_in_a_value_stays_in_that_value() {
        let arg = Opts::implied("socket").set("id", "ser0").set("path", "/run/a,server=off,x=/etc/passwd").build();
        assert_eq!(arg, "socket,id=ser0,path=/run/a,,server=off,,x=/etc/passwd");
        assert_eq!(
            parse(&arg),
            [
                (None, "socket".to_owned()),
                (Some("id".to_owned()), "ser0".to_owned()),
                (Some("path".to_owned()), "/run/a,server=off,x=/etc/passwd".to_owned()),
            ]
        );
    }

    #[test]
    fn equals_signs_and_trailing_commas_round_trip() {
        for v in ["a=b", "=", ",", ",,", "x,", ",x", "", "ü,ß=1"] {
            let arg = Opts::implied("socket").set("k", v).build();
            assert_eq!(parse(&arg), [(None, "socket".to_owned()), (Some("k".to_owned()), v.to_owned())], "{arg}");
        }
    }

    proptest::proptest! {
        /// Any values come back as exactly the intended elements, under exactly their keys.
        #[test]
        fn any_strings_parse_back_into_exactly_the_intended_options(a in ".*", b in ".*") {
            let arg = Opts::implied("socket").set("id", &a).set("path", &b).build();
            proptest::prop_assert_eq!(
                parse(&arg),
                vec![(None, "socket".to_owned()), (Some("id".to_owned()), a.clone()), (Some("path".to_owned()), b.clone())]
            );
        }
    }
}
