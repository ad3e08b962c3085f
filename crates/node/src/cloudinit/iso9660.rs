//! A minimal ISO 9660 image writer with a Joliet tree: the few files and directories of a
//! cloud-init seed, in memory.
//!
//! # Why Joliet, and why here
//! NoCloud's and ConfigDrive's file names (`meta-data`, `openstack/latest/user_data`) are lower
//! case with `-`, which plain ISO 9660 names (upper-case d-characters, `NAME.EXT;1`) cannot hold.
//! KubeVirt runs `xorrisofs -joliet -rock`; Joliet alone keeps the names (UCS-2, any case) and
//! every reader cloud-init runs on reads it (Linux's isofs prefers it when there is no Rock
//! Ridge; BSD's cd9660 and Windows read it too). The image is built in the agent so that nothing
//! of the spec reaches a command line: no genisoimage/xorriso process.
//!
//! # Layout (2048-byte sectors)
//! 0–15 system area (zeros); 16 primary volume descriptor; 17 Joliet supplementary volume
//! descriptor (escape `%/E`, UCS-2 level 3); 18 set terminator; 19–22 the primary tree's L and M
//! path tables, then the Joliet tree's; then the primary tree's directories, the Joliet tree's,
//! and the file data, which both trees share. Records never cross a sector; directories and path
//! tables are sorted as ECMA-119 asks (identifiers in byte order; path tables by level, parent,
//! identifier). The primary tree's names are ISO 9660 level 2 (`META_DATA.;1`).
//!
//! # Guarantees
//! The same input gives the same bytes. Paths are checked (components of `[A-Za-z0-9._-]`, at
//! most 64 characters, no `.`/`..`), a name given twice or two names that map to the same
//! primary name are errors, and the image is at most [`MAX_IMAGE_BYTES`].

use std::collections::BTreeMap;

/// The largest image [`build`] writes.
pub const MAX_IMAGE_BYTES: usize = 16 << 20;

const SECTOR: usize = 2048;
/// The first sector after the fixed ones (descriptors 16–18, path tables 19–22).
const FIRST_FREE: usize = 23;

/// Errors building an image.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IsoError {
    #[error("volume label {0:?}: use 1 to 16 characters of [A-Za-z0-9_-]")]
    Label(String),
    #[error("path {path:?}: {why}")]
    Path { path: String, why: &'static str },
    #[error("path {0:?} is given twice (or names a directory)")]
    Duplicate(String),
    #[error("paths {a:?} and {b:?} have the same ISO 9660 name {name:?}")]
    NameClash { a: String, b: String, name: String },
    #[error("the image would be {0} bytes; at most {MAX_IMAGE_BYTES}")]
    TooLarge(usize),
}

/// A UTC time for the image's dates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub year: u16,
    pub month: u8,
    pub day: u8,
    pub hour: u8,
    pub minute: u8,
    pub second: u8,
}

impl Stamp {
    /// `t` in UTC.
    #[must_use]
    pub fn of(t: jiff::Timestamp) -> Stamp {
        let d = jiff::tz::Offset::UTC.to_datetime(t);
        let b = |v: i8| u8::try_from(v).unwrap_or(0);
        Stamp {
            year: u16::try_from(d.year()).unwrap_or(1970),
            month: b(d.month()),
            day: b(d.day()),
            hour: b(d.hour()),
            minute: b(d.minute()),
            second: b(d.second()),
        }
    }

    /// A directory record's 7-byte date (ECMA-119 9.1.5).
    fn record(self) -> [u8; 7] {
        let year = u8::try_from(self.year.saturating_sub(1900)).unwrap_or(u8::MAX);
        [year, self.month, self.day, self.hour, self.minute, self.second, 0]
    }

    /// A volume descriptor's 17-byte date (ECMA-119 8.4.26.1).
    fn descriptor(self) -> [u8; 17] {
        let s = format!("{:04}{:02}{:02}{:02}{:02}{:02}00", self.year, self.month, self.day, self.hour, self.minute, self.second);
        let mut out = [0u8; 17];
        out[..16].copy_from_slice(&s.as_bytes()[..16]);
        out
    }
}

/// One directory of the tree (index 0 is the root).
struct Dir {
    name: String,
    parent: usize,
    dirs: Vec<usize>,
    files: Vec<usize>,
}

/// What a directory record points at.
#[derive(Clone, Copy)]
enum Target {
    Dir(usize),
    File(usize),
}

/// The two trees: the primary one (ISO 9660 level 2 names) and Joliet's (UCS-2 names).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Naming {
    Primary,
    Joliet,
}

impl Naming {
    fn dir(self, name: &str) -> Vec<u8> {
        match self {
            Naming::Primary => d_chars(name, 31),
            Naming::Joliet => ucs2(name),
        }
    }

    fn file(self, name: &str) -> Vec<u8> {
        match self {
            Naming::Primary => {
                let (base, ext) = name.rsplit_once('.').unwrap_or((name, ""));
                let ext = d_chars(ext, 30);
                let mut out = d_chars(base, 30 - ext.len().min(30));
                out.push(b'.');
                out.extend(ext);
                out.extend(b";1");
                out
            }
            Naming::Joliet => ucs2(name),
        }
    }
}

/// Upper-case d-characters (`A-Z0-9_`), anything else as `_`, at most `max`.
fn d_chars(s: &str, max: usize) -> Vec<u8> {
    s.bytes().take(max).map(|b| if b.is_ascii_alphanumeric() { b.to_ascii_uppercase() } else { b'_' }).collect()
}

/// UCS-2, big-endian (Joliet). Callers pass ASCII only.
fn ucs2(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_be_bytes).collect()
}

fn both16(v: u16) -> [u8; 4] {
    let (l, b) = (v.to_le_bytes(), v.to_be_bytes());
    [l[0], l[1], b[0], b[1]]
}

fn both32(v: u32) -> [u8; 8] {
    let (l, b) = (v.to_le_bytes(), v.to_be_bytes());
    [l[0], l[1], l[2], l[3], b[0], b[1], b[2], b[3]]
}

/// Sectors for `bytes`.
fn sectors(bytes: usize) -> usize {
    bytes.div_ceil(SECTOR)
}

/// The length of a directory record with an identifier of `n` bytes (padded to even).
fn record_len(n: usize) -> usize {
    33 + n + usize::from(n.is_multiple_of(2))
}

/// One tree's directories on the image.
struct Layout {
    naming: Naming,
    /// Directories in path-table order.
    order: Vec<usize>,
    /// Path-table number by directory (1-based).
    number: Vec<u16>,
    /// Records of each directory (after `.` and `..`), sorted by identifier.
    entries: Vec<Vec<(Vec<u8>, Target)>>,
    location: Vec<u32>,
    size: Vec<u32>,
}

impl Layout {
    fn new(dirs: &[Dir], names: &[String], naming: Naming, next: &mut usize) -> Layout {
        let entries: Vec<Vec<(Vec<u8>, Target)>> = dirs
            .iter()
            .map(|d| {
                let mut e: Vec<(Vec<u8>, Target)> = d.dirs.iter().map(|&c| (naming.dir(&dirs[c].name), Target::Dir(c))).collect();
                e.extend(d.files.iter().map(|&f| (naming.file(&names[f]), Target::File(f))));
                e.sort_by(|a, b| a.0.cmp(&b.0));
                e
            })
            .collect();
        // Path-table order: breadth first, each directory's children by identifier, so by
        // level, then parent number, then identifier.
        let mut order = vec![0];
        let mut i = 0;
        while i < order.len() {
            order.extend(entries[order[i]].iter().filter_map(|(_, t)| if let Target::Dir(c) = t { Some(*c) } else { None }));
            i += 1;
        }
        let mut number = vec![0u16; dirs.len()];
        for (n, &d) in order.iter().enumerate() {
            number[d] = u16::try_from(n + 1).unwrap_or(u16::MAX);
        }
        let (mut location, mut size) = (vec![0u32; dirs.len()], vec![0u32; dirs.len()]);
        for &d in &order {
            let bytes = Self::place(&entries[d]).last().map_or(0, |&(at, len)| at + len);
            location[d] = u32::try_from(*next).unwrap_or(u32::MAX);
            let n = sectors(bytes);
            size[d] = u32::try_from(n * SECTOR).unwrap_or(u32::MAX);
            *next += n;
        }
        Layout { naming, order, number, entries, location, size }
    }

    /// Offsets and lengths of a directory's records (`.`, `..`, then `entries`) within its
    /// extent: a record that would cross a sector starts the next one.
    fn place(entries: &[(Vec<u8>, Target)]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut at = 0;
        for n in [1, 1].into_iter().chain(entries.iter().map(|(id, _)| id.len())) {
            let len = record_len(n);
            if at % SECTOR + len > SECTOR {
                at = at.next_multiple_of(SECTOR);
            }
            out.push((at, len));
            at += len;
        }
        out
    }

    /// The path table, little-endian (type L) or big-endian (type M).
    fn path_table(&self, dirs: &[Dir], big: bool) -> Vec<u8> {
        let mut t = Vec::new();
        for &d in &self.order {
            let id = if d == 0 { vec![0] } else { self.naming.dir(&dirs[d].name) };
            let (loc, parent) = (self.location[d], self.number[dirs[d].parent]);
            t.push(u8::try_from(id.len()).unwrap_or(u8::MAX));
            t.push(0);
            t.extend(if big { loc.to_be_bytes() } else { loc.to_le_bytes() });
            t.extend(if big { parent.to_be_bytes() } else { parent.to_le_bytes() });
            t.extend(&id);
            if id.len() % 2 == 1 {
                t.push(0);
            }
        }
        t
    }
}

/// A directory record.
fn record(id: &[u8], location: u32, size: u32, dir: bool, at: Stamp) -> Vec<u8> {
    let mut r = Vec::with_capacity(record_len(id.len()));
    r.push(u8::try_from(record_len(id.len())).unwrap_or(u8::MAX));
    r.push(0);
    r.extend(both32(location));
    r.extend(both32(size));
    r.extend(at.record());
    r.push(if dir { 2 } else { 0 });
    r.extend([0, 0]);
    r.extend(both16(1));
    r.push(u8::try_from(id.len()).unwrap_or(u8::MAX));
    r.extend(id);
    if id.len().is_multiple_of(2) {
        r.push(0);
    }
    r
}

/// Checks one path and splits it into components.
fn components(path: &str) -> Result<Vec<&str>, IsoError> {
    let bad = |why| IsoError::Path { path: path.to_owned(), why };
    let parts: Vec<&str> = path.split('/').collect();
    for p in &parts {
        if p.is_empty() || *p == "." || *p == ".." {
            return Err(bad("every component must be a name (no empty, . or .. components)"));
        }
        if p.len() > 64 {
            return Err(bad("a component is longer than 64 characters (Joliet's limit)"));
        }
        if !p.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
            return Err(bad("use only [A-Za-z0-9._-] in names"));
        }
    }
    Ok(parts)
}

/// Builds an ISO 9660 image with a Joliet tree, volume label `label`, holding `files` (path
/// with `/` between directories, content), dated `at`.
///
/// # Errors
/// [`IsoError`]: a bad label or path, a path given twice, two names with one primary name, an
/// image over [`MAX_IMAGE_BYTES`].
pub fn build(label: &str, files: &[(&str, &[u8])], at: Stamp) -> Result<Vec<u8>, IsoError> {
    if label.is_empty() || label.len() > 16 || !label.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-')) {
        return Err(IsoError::Label(label.to_owned()));
    }
    let data_bytes: usize = files.iter().map(|(_, d)| sectors(d.len()) * SECTOR).sum();
    if data_bytes > MAX_IMAGE_BYTES {
        return Err(IsoError::TooLarge(data_bytes));
    }
    // The tree.
    let mut dirs = vec![Dir { name: String::new(), parent: 0, dirs: Vec::new(), files: Vec::new() }];
    let mut names = Vec::new();
    let mut taken: BTreeMap<(usize, String), String> = BTreeMap::new();
    let mut primary: BTreeMap<(usize, Vec<u8>), String> = BTreeMap::new();
    for (f, (path, _)) in files.iter().enumerate() {
        let parts = components(path)?;
        let (leaf, parents) = parts.split_last().ok_or_else(|| IsoError::Path { path: (*path).to_owned(), why: "empty" })?;
        let mut at_dir = 0;
        for p in parents {
            let found = dirs[at_dir].dirs.iter().copied().find(|&c| dirs[c].name == *p);
            at_dir = match found {
                Some(c) => c,
                None => {
                    if taken.contains_key(&(at_dir, (*p).to_owned())) {
                        return Err(IsoError::Duplicate((*path).to_owned()));
                    }
                    let c = dirs.len();
                    dirs.push(Dir { name: (*p).to_owned(), parent: at_dir, dirs: Vec::new(), files: Vec::new() });
                    dirs[at_dir].dirs.push(c);
                    taken.insert((at_dir, (*p).to_owned()), (*path).to_owned());
                    claim_primary(&mut primary, at_dir, Naming::Primary.dir(p), path)?;
                    c
                }
            };
        }
        if taken.insert((at_dir, (*leaf).to_owned()), (*path).to_owned()).is_some() {
            return Err(IsoError::Duplicate((*path).to_owned()));
        }
        claim_primary(&mut primary, at_dir, Naming::Primary.file(leaf), path)?;
        names.push((*leaf).to_owned());
        dirs[at_dir].files.push(f);
    }
    // Where everything goes.
    let mut next = FIRST_FREE;
    let trees = [Layout::new(&dirs, &names, Naming::Primary, &mut next), Layout::new(&dirs, &names, Naming::Joliet, &mut next)];
    let mut file_at = Vec::with_capacity(files.len());
    for (_, data) in files {
        file_at.push(u32::try_from(next).unwrap_or(u32::MAX));
        next += sectors(data.len());
    }
    let total = next * SECTOR;
    if total > MAX_IMAGE_BYTES {
        return Err(IsoError::TooLarge(total));
    }
    let mut img = vec![0u8; total];
    let size_of = |t: Target, tree: &Layout| match t {
        Target::Dir(d) => (tree.location[d], tree.size[d], true),
        Target::File(f) => (file_at[f], u32::try_from(files[f].1.len()).unwrap_or(u32::MAX), false),
    };
    for (k, tree) in trees.iter().enumerate() {
        let tables = [tree.path_table(&dirs, false), tree.path_table(&dirs, true)];
        for (j, t) in tables.iter().enumerate() {
            let at_byte = (19 + 2 * k + j) * SECTOR;
            img[at_byte..at_byte + t.len()].copy_from_slice(t);
        }
        let table_len = u32::try_from(tables[0].len()).unwrap_or(u32::MAX);
        let root = record(&[0], tree.location[0], tree.size[0], true, at);
        let l_table = u32::try_from(19 + 2 * k).unwrap_or(u32::MAX);
        let vd = descriptor(tree.naming, label, u32::try_from(next).unwrap_or(u32::MAX), table_len, l_table, &root, at);
        img[(16 + k) * SECTOR..(17 + k) * SECTOR].copy_from_slice(&vd);
        for (d, dir) in dirs.iter().enumerate() {
            let mut recs = vec![
                record(&[0], tree.location[d], tree.size[d], true, at),
                record(&[1], tree.location[dir.parent], tree.size[dir.parent], true, at),
            ];
            for (id, t) in &tree.entries[d] {
                let (loc, size, is_dir) = size_of(*t, tree);
                recs.push(record(id, loc, size, is_dir, at));
            }
            let base = tree.location[d] as usize * SECTOR;
            for ((off, _), r) in Layout::place(&tree.entries[d]).into_iter().zip(recs) {
                img[base + off..base + off + r.len()].copy_from_slice(&r);
            }
        }
    }
    img[18 * SECTOR..18 * SECTOR + 7].copy_from_slice(&[255, b'C', b'D', b'0', b'0', b'1', 1]);
    for ((_, data), &loc) in files.iter().zip(&file_at) {
        let base = loc as usize * SECTOR;
        img[base..base + data.len()].copy_from_slice(data);
    }
    Ok(img)
}

/// Records the primary name `id` in directory `dir` for `path`; two paths on one name clash.
fn claim_primary(primary: &mut BTreeMap<(usize, Vec<u8>), String>, dir: usize, id: Vec<u8>, path: &str) -> Result<(), IsoError> {
    let name = String::from_utf8_lossy(&id).into_owned();
    match primary.insert((dir, id), path.to_owned()) {
        Some(a) if a != path => Err(IsoError::NameClash { a, b: path.to_owned(), name }),
        _ => Ok(()),
    }
}

/// The primary volume descriptor, or Joliet's supplementary one.
fn descriptor(naming: Naming, label: &str, volume_sectors: u32, table_len: u32, l_table: u32, root: &[u8], at: Stamp) -> Vec<u8> {
    let joliet = naming == Naming::Joliet;
    let mut vd = vec![0u8; SECTOR];
    vd[0] = if joliet { 2 } else { 1 };
    vd[1..6].copy_from_slice(b"CD001");
    vd[6] = 1;
    // Text fields: space-padded ASCII, or UCS-2 in Joliet's.
    let text = |vd: &mut [u8], at: usize, len: usize, s: &str| {
        let bytes = if joliet { ucs2(s) } else { s.as_bytes().to_vec() };
        let pad: &[u8] = if joliet { &[0, b' '] } else { b" " };
        let field = &mut vd[at..at + len];
        for (i, b) in field.iter_mut().enumerate() {
            *b = bytes.get(i).copied().unwrap_or_else(|| pad[(i - bytes.len()) % pad.len()]);
        }
    };
    text(&mut vd, 8, 32, "LINUX");
    // The label as given (lower case too), as genisoimage and xorriso write `-volid cidata`:
    // blkid and cloud-init read it back verbatim.
    text(&mut vd, 40, 32, label);
    vd[80..88].copy_from_slice(&both32(volume_sectors));
    if joliet {
        vd[88..91].copy_from_slice(b"%/E");
    }
    vd[120..124].copy_from_slice(&both16(1));
    vd[124..128].copy_from_slice(&both16(1));
    vd[128..132].copy_from_slice(&both16(2048));
    vd[132..140].copy_from_slice(&both32(table_len));
    vd[140..144].copy_from_slice(&l_table.to_le_bytes());
    vd[148..152].copy_from_slice(&(l_table + 1).to_be_bytes());
    vd[156..156 + root.len()].copy_from_slice(root);
    for (at_byte, len) in [(190, 128), (318, 128), (446, 128)] {
        text(&mut vd, at_byte, len, "");
    }
    text(&mut vd, 574, 128, "VIRTPLUG");
    vd[702..813].fill(b' ');
    let date = at.descriptor();
    vd[813..830].copy_from_slice(&date);
    vd[830..847].copy_from_slice(&date);
    for at_byte in [847, 864] {
        vd[at_byte..at_byte + 16].fill(b'0');
    }
    vd[881] = 1;
    vd
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: Stamp = Stamp { year: 2024, month: 5, day: 6, hour: 7, minute: 8, second: 9 };

    fn u32_le(b: &[u8], at: usize) -> usize {
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
    }

    /// The records of the directory at (`location`, `size`): (identifier, location, size, is dir).
    fn records(img: &[u8], location: usize, size: usize) -> Vec<(Vec<u8>, usize, usize, bool)> {
        let mut out = Vec::new();
        let (start, end) = (location * SECTOR, location * SECTOR + size);
        let mut at = start;
        while at < end {
            let len = img[at] as usize;
            if len == 0 {
                at = (at / SECTOR + 1) * SECTOR;
                continue;
            }
            let r = &img[at..at + len];
            let n = r[32] as usize;
            out.push((r[33..33 + n].to_vec(), u32_le(r, 2), u32_le(r, 10), r[25] & 2 != 0));
            at += len;
        }
        out
    }

    /// Reads `path` through the tree of the descriptor in `sector` (16 primary, 17 Joliet),
    /// naming components with `name`.
    fn read(img: &[u8], sector: usize, path: &str, name: impl Fn(&str, bool) -> Vec<u8>) -> Option<Vec<u8>> {
        let root = &img[sector * SECTOR + 156..];
        let (mut loc, mut size) = (u32_le(root, 2), u32_le(root, 10));
        let parts: Vec<&str> = path.split('/').collect();
        for (i, p) in parts.iter().enumerate() {
            let last = i == parts.len() - 1;
            let (_, l, s, _) = records(img, loc, size).into_iter().find(|(id, _, _, d)| *id == name(p, last) && *d != last)?;
            (loc, size) = (l, s);
        }
        Some(img[loc * SECTOR..loc * SECTOR + size].to_vec())
    }

    fn joliet(p: &str, _file: bool) -> Vec<u8> {
        ucs2(p)
    }

    fn primary(p: &str, file: bool) -> Vec<u8> {
        if file {
            Naming::Primary.file(p)
        } else {
            Naming::Primary.dir(p)
        }
    }

    #[test]
    fn both_trees_hold_every_file_and_the_descriptors_say_what_readers_check() {
        let big = vec![7u8; 5000];
        let files: [(&str, &[u8]); 4] = [
            ("meta-data", b"{\"instance-id\":\"x\"}"),
            ("user-data", b"#cloud-config\n"),
            ("openstack/latest/user_data", &big),
            ("openstack/latest/meta_data.json", b"{}"),
        ];
        let img = build("cidata", &files, AT).unwrap();
        assert_eq!(img.len() % SECTOR, 0);
        assert_eq!(&img[16 * SECTOR..16 * SECTOR + 7], &[1, b'C', b'D', b'0', b'0', b'1', 1]);
        assert_eq!(&img[16 * SECTOR + 40..16 * SECTOR + 48], b"cidata  ");
        assert_eq!(&img[17 * SECTOR + 88..17 * SECTOR + 91], b"%/E", "Joliet level 3");
        assert_eq!(&img[17 * SECTOR + 40..17 * SECTOR + 52], &ucs2("cidata")[..]);
        assert_eq!(&img[18 * SECTOR..18 * SECTOR + 6], &[255, b'C', b'D', b'0', b'0', b'1']);
        assert_eq!(u32_le(&img, 16 * SECTOR + 80) * SECTOR, img.len(), "volume space size");
        for (path, data) in files {
            assert_eq!(read(&img, 17, path, joliet).as_deref(), Some(data), "Joliet {path}");
            assert_eq!(read(&img, 16, path, primary).as_deref(), Some(data), "primary {path}");
        }
        assert_eq!(Naming::Primary.file("meta_data.json"), b"META_DATA.JSON;1");
        assert_eq!(build("cidata", &files, AT).unwrap(), img, "deterministic");
    }

    #[test]
    fn directories_spill_into_more_sectors_without_splitting_a_record() {
        let names: Vec<String> = (0..60).map(|i| format!("file-with-a-long-name-{i:02}")).collect();
        let files: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), n.as_bytes())).collect();
        let img = build("cidata", &files, AT).unwrap();
        for (n, _) in &files {
            assert_eq!(read(&img, 17, n, joliet).as_deref(), Some(n.as_bytes()), "{n}");
        }
    }

    #[test]
    fn bad_input_is_refused_not_written() {
        let f: &[u8] = b"x";
        for (label, files, want) in [
            ("c i", vec![("a", f)], "volume label"),
            ("", vec![("a", f)], "volume label"),
            ("cidata", vec![("../a", f)], "no empty, . or .."),
            ("cidata", vec![("a//b", f)], "no empty"),
            ("cidata", vec![("a b", f)], "[A-Za-z0-9._-]"),
            ("cidata", vec![("a", f), ("a", f)], "given twice"),
            ("cidata", vec![("a/b", f), ("a", f)], "given twice"),
            ("cidata", vec![("a-b", f), ("a_b", f)], "same ISO 9660 name"),
        ] {
            let e = build(label, &files, AT).unwrap_err().to_string();
            assert!(e.contains(want), "{label} {:?}: {e}", files.iter().map(|f| f.0).collect::<Vec<_>>());
        }
        let huge = vec![0u8; MAX_IMAGE_BYTES];
        assert!(matches!(build("cidata", &[("a", &huge)], AT), Err(IsoError::TooLarge(_))));
    }

    /// Another implementation reads the image back: xorriso (installed by
    /// scripts/install-deps.sh) lists the Joliet names and extracts the files, blkid reads the
    /// label. The guest's Linux is the reader that counts; tests/e2e.rs boots it on these.
    #[test]
    fn xorriso_and_blkid_read_the_image() {
        let dir = tempfile::tempdir().unwrap();
        let iso = dir.path().join("seed.iso");
        let files: [(&str, &[u8]); 2] = [("meta-data", b"instance-id: x\n"), ("openstack/latest/user_data", b"#cloud-config\nhello\n")];
        std::fs::write(&iso, build("config-2", &files, AT).unwrap()).unwrap();
        let out = std::process::Command::new("blkid").args(["-p", "-o", "export"]).arg(&iso).output().expect("blkid runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("LABEL=config-2") && text.contains("TYPE=iso9660"), "blkid: {text}");
        let x = dir.path().join("x");
        let out = std::process::Command::new("xorriso")
            .args(["-abort_on", "NEVER", "-indev"])
            .arg(&iso)
            .args(["-osirrox", "on", "-extract", "/"])
            .arg(&x)
            .output()
            .expect("xorriso runs (scripts/install-deps.sh installs it)");
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "xorriso: {log}");
        assert_eq!(std::fs::read(x.join("meta-data")).unwrap(), files[0].1, "{log}");
        assert_eq!(std::fs::read(x.join("openstack/latest/user_data")).unwrap(), files[1].1, "{log}");
    }
}
