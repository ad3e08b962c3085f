//! `/proc/PID/mountinfo`, parsed by us: the `procfs` crate does not unescape `\040`, and the node
//! agent must compare paths exactly (a volume path with a space must match its mount).
//!
//! Format (proc(5)): `ID PARENT MAJOR:MINOR ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE
//! SOURCE SUPER_OPTIONS`. `ROOT`, `MOUNT_POINT` and `SOURCE` escape space, tab, newline and
//! backslash as three-digit octal (`\040`, `\011`, `\012`, `\134`). `ROOT` is the bind root:
//! the directory of the source filesystem that is mounted (`/` for a whole filesystem).

use std::path::{Path, PathBuf};

/// One mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    pub id: u32,
    pub parent: u32,
    pub major: u32,
    pub minor: u32,
    /// The bind root inside the source filesystem.
    pub root: PathBuf,
    pub mount_point: PathBuf,
    pub options: String,
    /// `shared:N`, `master:N`, `propagate_from:N`, `unbindable`.
    pub optional: Vec<String>,
    pub fstype: String,
    pub source: String,
    pub super_options: String,
}

/// A line that is not a mountinfo entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("mountinfo line {line}: {why}: {text:?}")]
pub struct ParseError {
    pub line: usize,
    pub why: &'static str,
    pub text: String,
}

/// Undoes the kernel's octal escapes (`\ooo`). A backslash not followed by three octal digits
/// is kept as it is.
#[must_use]
pub fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            let digits = &b[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = u32::from(digits[0] - b'0') * 64 + u32::from(digits[1] - b'0') * 8 + u32::from(digits[2] - b'0');
                if let Ok(byte) = u8::try_from(v) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_line(n: usize, line: &str) -> Result<Mount, ParseError> {
    let err = |why| ParseError { line: n, why, text: line.to_owned() };
    let fields: Vec<&str> = line.split(' ').collect();
    let sep = fields.iter().position(|f| *f == "-").ok_or_else(|| err("no \"-\" separator"))?;
    if sep < 6 || fields.len() < sep + 4 {
        return Err(err("too few fields"));
    }
    let num = |s: &str| s.parse::<u32>().map_err(|_| err("not a number"));
    let (major, minor) = fields[2].split_once(':').ok_or_else(|| err("no MAJOR:MINOR"))?;
    Ok(Mount {
        id: num(fields[0])?,
        parent: num(fields[1])?,
        major: num(major)?,
        minor: num(minor)?,
        root: PathBuf::from(unescape(fields[3])),
        mount_point: PathBuf::from(unescape(fields[4])),
        options: fields[5].to_owned(),
        optional: fields[6..sep].iter().map(|s| (*s).to_owned()).collect(),
        fstype: fields[sep + 1].to_owned(),
        source: unescape(fields[sep + 2]),
        super_options: fields[sep + 3..].join(" "),
    })
}

/// Parses a whole mountinfo text. Empty lines are skipped.
///
/// # Errors
/// The first malformed line.
pub fn parse(text: &str) -> Result<Vec<Mount>, ParseError> {
    text.lines().enumerate().filter(|(_, l)| !l.is_empty()).map(|(i, l)| parse_line(i + 1, l)).collect()
}

/// The mounts of `pid`'s mount namespace (`None`: this process).
///
/// # Errors
/// When the file cannot be read or parsed.
pub fn read(pid: Option<i32>) -> std::io::Result<Vec<Mount>> {
    let path = pid.map_or_else(|| PathBuf::from("/proc/self/mountinfo"), |p| PathBuf::from(format!("/proc/{p}/mountinfo")));
    let text = std::fs::read_to_string(&path)?;
    parse(&text).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The mounts whose mount point is `path` or below it.
#[must_use]
pub fn under<'a>(mounts: &'a [Mount], path: &Path) -> Vec<&'a Mount> {
    mounts.iter().filter(|m| m.mount_point.starts_with(path)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
36 22 98:0 /mnt1 /mnt\\040two rw,noatime master:1 propagate_from:2 - ext3 /dev/root rw,errors=continue\n\
40 22 0:35 /vol\\134x /var/lib/kubelet/pods/p/volumes/a\\011b rw - tmpfs tmp\\040fs rw,size=1k\n\
41 22 0:36 / /no/optional rw - proc proc rw\n";

    #[test]
    fn parses_escapes_optional_fields_and_bind_roots() {
        let m = parse(SAMPLE).unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].optional, ["shared:1"]);
        assert_eq!((m[1].id, m[1].parent, m[1].major, m[1].minor), (36, 22, 98, 0));
        assert_eq!(m[1].root, Path::new("/mnt1"), "bind root");
        assert_eq!(m[1].mount_point, Path::new("/mnt two"), "\\040 is a space");
        assert_eq!(m[1].optional, ["master:1", "propagate_from:2"]);
        assert_eq!(m[1].super_options, "rw,errors=continue");
        assert_eq!(m[2].root, Path::new("/vol\\x"), "\\134 is a backslash");
        assert_eq!(m[2].mount_point, Path::new("/var/lib/kubelet/pods/p/volumes/a\tb"));
        assert_eq!(m[2].source, "tmp fs");
        assert!(m[3].optional.is_empty());
        assert_eq!(under(&m, Path::new("/var/lib/kubelet")).len(), 1);
    }

    #[test]
    fn malformed_lines_name_the_line() {
        let e = parse("22 1 8:1 / / rw shared:1 ext4 /dev/sda1 rw").unwrap_err();
        assert_eq!((e.line, e.why), (1, "no \"-\" separator"));
        assert_eq!(parse("x 1 8:1 / / rw - ext4 s o").unwrap_err().why, "not a number");
        assert_eq!(parse("1 1 8:1 / / - ext4").unwrap_err().why, "too few fields");
    }

    #[test]
    fn a_lone_or_short_backslash_is_kept() {
        assert_eq!(unescape("a\\b"), "a\\b");
        assert_eq!(unescape("end\\04"), "end\\04");
        assert_eq!(unescape("\\040\\041"), " !");
        assert_eq!(unescape("\\777"), "\\777", "not a byte: kept");
    }

    #[test]
    fn this_process_mounts_parse() {
        let m = read(None).unwrap();
        assert!(m.iter().any(|m| m.mount_point == Path::new("/")));
    }

    /// The kernel's escaping, for the property tests.
    fn escape(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b' ' | b'\t' | b'\n' | b'\\' => format!("\\{b:03o}"),
                _ => (b as char).to_string(),
            })
            .collect()
    }

    proptest::proptest! {
        /// Any path the kernel escapes comes back exactly.
        #[test]
        fn escape_then_unescape_is_identity(path in "[ -~\t\n]{0,40}") {
            proptest::prop_assert_eq!(unescape(&escape(&path)), path.clone());
            let line = format!("5 1 0:1 / {} rw - tmpfs {} rw", escape(&format!("/{path}")), escape(&path));
            let m = parse(&line).unwrap();
            proptest::prop_assert_eq!(m[0].mount_point.to_string_lossy().into_owned(), format!("/{path}"));
            proptest::prop_assert_eq!(&m[0].source, &path);
        }

        /// Fuzz: any input is a result, never a panic.
        #[test]
        fn arbitrary_input_never_panics(text in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let s = String::from_utf8_lossy(&text);
            let _ = parse(&s);
            let _ = unescape(&s);
        }
    }
}
