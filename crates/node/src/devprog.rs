//! cgroup v2 device control: a generated eBPF program (`BPF_PROG_TYPE_CGROUP_DEVICE`) attached
//! to a VM's cgroup, the v2 counterpart of v1's `devices.allow`/`devices.deny`.
//!
//! The policy is the one bind-mount mode uses on v1: every character device is allowed, a block
//! device only when it is in the allowlist, with the access it was granted (`r`, or `rw`);
//! `mknod` of a block device is never allowed from inside the VM (the helper makes the nodes, from
//! outside the cgroup).
//!
//! A device program cannot be edited, so every change loads a new program for the whole
//! allowlist, attaches it next to the old one (`BPF_F_ALLOW_MULTI`: while both are attached a
//! device must pass both), then detaches every other program of the cgroup, found by asking the
//! kernel (`BPF_PROG_QUERY`) — so an agent restarted with no memory of what it attached still
//! replaces it. (youki's libcgroups and runc generate the same kind of program.)

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

/// A device number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceNumber {
    pub major: u32,
    pub minor: u32,
}

impl DeviceNumber {
    /// The number of the device `fd` is open on.
    ///
    /// # Errors
    /// As `fstat`.
    pub fn of(fd: BorrowedFd<'_>) -> io::Result<DeviceNumber> {
        let st = rustix::fs::fstat(fd)?;
        Ok(DeviceNumber { major: rustix::fs::major(st.st_rdev), minor: rustix::fs::minor(st.st_rdev) })
    }
}

/// A block device the program allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlockRule {
    pub device: DeviceNumber,
    pub readonly: bool,
}

/// One eBPF instruction (`struct bpf_insn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn { code, dst, src, off, imm }
    }

    fn encode(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.code;
        b[1] = (self.src << 4) | (self.dst & 0x0f);
        b[2..4].copy_from_slice(&self.off.to_le_bytes());
        b[4..8].copy_from_slice(&self.imm.to_le_bytes());
        b
    }
}

// Opcodes (linux/bpf.h, linux/bpf_common.h).
const LDX_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const MOV64_X: u8 = 0xbf; // BPF_ALU64 | BPF_MOV | BPF_X
const MOV64_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const AND64_K: u8 = 0x57; // BPF_ALU64 | BPF_AND | BPF_K
const RSH64_K: u8 = 0x77; // BPF_ALU64 | BPF_RSH | BPF_K
const JEQ_K: u8 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
const JA: u8 = 0x05; // BPF_JMP | BPF_JA
const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT

// struct bpf_cgroup_dev_ctx { u32 access_type /* (access << 16) | type */; u32 major; u32 minor; }
const DEV_BLOCK: i32 = 1;
const DEV_CHAR: i32 = 2;
const ACC_READ: i32 = 2;
const ACC_WRITE: i32 = 4;
const ACC_ALL: i32 = 7; // mknod | read | write

/// The program for `rules`: char devices allowed, listed block devices with their access.
#[must_use]
pub fn program(rules: &[BlockRule]) -> Vec<Insn> {
    const RULE_LEN: usize = 7;
    let mut p = vec![
        Insn::new(LDX_W, 2, 1, 0, 0),        // r2 = ctx->access_type
        Insn::new(MOV64_X, 3, 2, 0, 0),      // r3 = r2
        Insn::new(AND64_K, 3, 0, 0, 0xffff), // r3 = device type
        Insn::new(RSH64_K, 2, 0, 0, 16),     // r2 = requested access
        Insn::new(LDX_W, 4, 1, 4, 0),        // r4 = ctx->major
        Insn::new(LDX_W, 5, 1, 8, 0),        // r5 = ctx->minor
    ];
    // `if r3 == CHAR goto allow`, patched below once `allow` is known.
    let char_jump = p.len();
    p.push(Insn::new(JEQ_K, 3, 0, 0, DEV_CHAR));
    let mut to_allow = Vec::new();
    for r in rules {
        let granted = if r.readonly { ACC_READ } else { ACC_READ | ACC_WRITE };
        let start = p.len();
        let next = |at: usize| i16::try_from(start + RULE_LEN - (at + 1)).unwrap_or(i16::MAX);
        p.push(Insn::new(JNE_K, 3, 0, next(start), DEV_BLOCK));
        p.push(Insn::new(JNE_K, 4, 0, next(start + 1), r.device.major.cast_signed()));
        p.push(Insn::new(JNE_K, 5, 0, next(start + 2), r.device.minor.cast_signed()));
        p.push(Insn::new(MOV64_X, 0, 2, 0, 0)); // r0 = requested access
        p.push(Insn::new(AND64_K, 0, 0, 0, ACC_ALL & !granted)); // r0 = what is not granted
        p.push(Insn::new(JNE_K, 0, 0, next(start + 5), 0));
        to_allow.push(p.len());
        p.push(Insn::new(JA, 0, 0, 0, 0));
    }
    p.push(Insn::new(MOV64_K, 0, 0, 0, 0)); // deny
    p.push(Insn::new(EXIT, 0, 0, 0, 0));
    let allow = p.len();
    p.push(Insn::new(MOV64_K, 0, 0, 0, 1));
    p.push(Insn::new(EXIT, 0, 0, 0, 0));
    for at in to_allow.into_iter().chain([char_jump]) {
        p[at].off = i16::try_from(allow - (at + 1)).unwrap_or(i16::MAX);
    }
    p
}

// bpf(2) commands and constants.
const BPF_PROG_LOAD: i64 = 5;
const BPF_PROG_ATTACH: i64 = 8;
const BPF_PROG_DETACH: i64 = 9;
const BPF_PROG_GET_FD_BY_ID: i64 = 13;
const BPF_OBJ_GET_INFO_BY_FD: i64 = 15;
const BPF_PROG_QUERY: i64 = 16;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;
/// `union bpf_attr` is passed as a zeroed buffer of this size with the command's fields set.
const ATTR_SIZE: usize = 128;

fn put32(a: &mut [u8; ATTR_SIZE], at: usize, v: u32) {
    a[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(a: &mut [u8; ATTR_SIZE], at: usize, v: u64) {
    a[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

fn fd_u32(fd: &impl AsRawFd) -> u32 {
    u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX)
}

/// bpf(2).
///
/// `attr` holds the command's fields; pointers in it must point to live buffers of the sizes it
/// states for the duration of the call.
fn bpf(cmd: i64, attr: &mut [u8; ATTR_SIZE]) -> io::Result<i64> {
    // SAFETY: `attr` is a writable, zero-initialised buffer of ATTR_SIZE bytes (at least the
    // size of every command's part of `union bpf_attr` used here), and its size is passed with
    // it, so the kernel reads and writes only inside it. The pointers stored in it by the
    // callers (instructions, license, log, id array, info struct) refer to buffers that live
    // across this call and whose lengths are the ones stored next to them.
    #[allow(unsafe_code)]
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), ATTR_SIZE) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned(fd: i64) -> io::Result<OwnedFd> {
    let raw = i32::try_from(fd).map_err(|_| io::Error::other("bpf returned an invalid fd"))?;
    // SAFETY: `raw` was just returned by a bpf(2) command that creates a new fd, which nothing
    // else owns; the OwnedFd closes it exactly once.
    #[allow(unsafe_code)]
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn load(insns: &[Insn]) -> io::Result<OwnedFd> {
    let code: Vec<u8> = insns.iter().flat_map(|i| i.encode()).collect();
    let license = c"GPL";
    let mut log = vec![0u8; 64 * 1024];
    let mut a = [0u8; ATTR_SIZE];
    put32(&mut a, 0, BPF_PROG_TYPE_CGROUP_DEVICE);
    put32(&mut a, 4, u32::try_from(insns.len()).map_err(io::Error::other)?);
    put64(&mut a, 8, code.as_ptr() as u64);
    put64(&mut a, 16, license.as_ptr() as u64);
    put32(&mut a, 24, 1); // log_level
    put32(&mut a, 28, u32::try_from(log.len()).unwrap_or(u32::MAX));
    put64(&mut a, 32, log.as_mut_ptr() as u64);
    put32(&mut a, 68, BPF_CGROUP_DEVICE); // expected_attach_type
    match bpf(BPF_PROG_LOAD, &mut a) {
        Ok(fd) => owned(fd),
        Err(e) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            Err(io::Error::new(e.kind(), format!("BPF_PROG_LOAD: {e}; verifier: {}", String::from_utf8_lossy(&log[..end]).trim())))
        }
    }
}

fn prog_id(prog: &OwnedFd) -> io::Result<u32> {
    let mut info = [0u8; 256]; // struct bpf_prog_info: type, id, ...
    let mut a = [0u8; ATTR_SIZE];
    put32(&mut a, 0, fd_u32(prog));
    put32(&mut a, 4, u32::try_from(info.len()).unwrap_or(0));
    put64(&mut a, 8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    Ok(u32::from_ne_bytes([info[4], info[5], info[6], info[7]]))
}

fn attached_ids(cgroup: &OwnedFd) -> io::Result<Vec<u32>> {
    let mut ids = [0u32; 64];
    let mut a = [0u8; ATTR_SIZE];
    put32(&mut a, 0, fd_u32(cgroup));
    put32(&mut a, 4, BPF_CGROUP_DEVICE);
    put64(&mut a, 16, ids.as_mut_ptr() as u64);
    put32(&mut a, 24, u32::try_from(ids.len()).unwrap_or(0));
    bpf(BPF_PROG_QUERY, &mut a)?;
    let n = u32::from_ne_bytes([a[24], a[25], a[26], a[27]]) as usize;
    Ok(ids[..n.min(ids.len())].to_vec())
}

fn attach_cmd(cmd: i64, cgroup: &OwnedFd, prog: &OwnedFd, flags: u32) -> io::Result<()> {
    let mut a = [0u8; ATTR_SIZE];
    put32(&mut a, 0, fd_u32(cgroup));
    put32(&mut a, 4, fd_u32(prog));
    put32(&mut a, 8, BPF_CGROUP_DEVICE);
    put32(&mut a, 12, flags);
    bpf(cmd, &mut a).map(|_| ())
}

/// Makes `rules` the device policy of the v2 cgroup `cgroup` (see the module doc): the new
/// program is attached before the old ones are detached.
///
/// # Errors
/// When the program cannot be loaded (with the verifier's log), attached, or an old one
/// detached.
pub fn set(cgroup: &Path, rules: &[BlockRule]) -> io::Result<()> {
    let ctx = |what: &'static str| move |e: io::Error| io::Error::new(e.kind(), format!("{what} on {}: {e}", cgroup.display()));
    let cg = rustix::fs::open(
        cgroup,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(io::Error::from)
    .map_err(ctx("open"))?;
    let prog = load(&program(rules)).map_err(ctx("load the device program"))?;
    attach_cmd(BPF_PROG_ATTACH, &cg, &prog, BPF_F_ALLOW_MULTI).map_err(ctx("BPF_PROG_ATTACH"))?;
    let mine = prog_id(&prog).map_err(ctx("BPF_OBJ_GET_INFO_BY_FD"))?;
    for id in attached_ids(&cg).map_err(ctx("BPF_PROG_QUERY"))?.into_iter().filter(|&id| id != mine) {
        let mut a = [0u8; ATTR_SIZE];
        put32(&mut a, 0, id);
        let old = owned(bpf(BPF_PROG_GET_FD_BY_ID, &mut a).map_err(ctx("BPF_PROG_GET_FD_BY_ID"))?)?;
        attach_cmd(BPF_PROG_DETACH, &cg, &old, 0).map_err(ctx("BPF_PROG_DETACH"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An interpreter for the few instructions [`program`] emits: the policy is checked by
    /// running the program, not by reading it.
    fn run(p: &[Insn], access: i32, kind: i32, major: u32, minor: u32) -> u64 {
        let ctx = [((access << 16) | kind).cast_unsigned(), major, minor];
        let mut r = [0u64; 11];
        let mut pc = 0usize;
        loop {
            let i = p[pc];
            let (d, s, k) = (usize::from(i.dst), usize::from(i.src), i64::from(i.imm).cast_unsigned());
            let jump = |pc: usize| (i64::try_from(pc).unwrap() + 1 + i64::from(i.off)) as usize;
            pc = match i.code {
                LDX_W => {
                    r[d] = u64::from(ctx[usize::try_from(i.off).unwrap() / 4]);
                    pc + 1
                }
                MOV64_X => {
                    r[d] = r[s];
                    pc + 1
                }
                MOV64_K => {
                    r[d] = k;
                    pc + 1
                }
                AND64_K => {
                    r[d] &= k;
                    pc + 1
                }
                RSH64_K => {
                    r[d] >>= k;
                    pc + 1
                }
                JEQ_K => {
                    if r[d] == k {
                        jump(pc)
                    } else {
                        pc + 1
                    }
                }
                JNE_K => {
                    if r[d] != k {
                        jump(pc)
                    } else {
                        pc + 1
                    }
                }
                JA => jump(pc),
                EXIT => return r[0],
                c => panic!("unexpected opcode {c:#x}"),
            };
        }
    }

    #[test]
    fn char_devices_pass_block_devices_only_as_granted() {
        let rw = BlockRule { device: DeviceNumber { major: 7, minor: 3 }, readonly: false };
        let ro = BlockRule { device: DeviceNumber { major: 259, minor: 1 }, readonly: true };
        let p = program(&[rw, ro]);
        assert_eq!(run(&p, ACC_READ | ACC_WRITE, DEV_CHAR, 1, 3), 1, "char devices allowed");
        assert_eq!(run(&p, ACC_READ | ACC_WRITE, DEV_BLOCK, 7, 3), 1, "rw rule allows rw");
        assert_eq!(run(&p, 1, DEV_BLOCK, 7, 3), 0, "mknod is never granted");
        assert_eq!(run(&p, ACC_READ, DEV_BLOCK, 259, 1), 1, "ro rule allows reading");
        assert_eq!(run(&p, ACC_WRITE, DEV_BLOCK, 259, 1), 0, "ro rule refuses writing");
        assert_eq!(run(&p, ACC_READ, DEV_BLOCK, 7, 4), 0, "another minor");
        assert_eq!(run(&p, ACC_READ, DEV_BLOCK, 8, 3), 0, "another major");
        assert_eq!(run(&program(&[]), ACC_READ, DEV_BLOCK, 7, 3), 0, "no rule, no block device");
        assert_eq!(run(&program(&[]), ACC_READ, DEV_CHAR, 10, 200), 1);
    }

    #[test]
    fn instructions_encode_as_the_kernel_lays_them_out() {
        let i = Insn::new(JNE_K, 4, 0, 3, 7);
        assert_eq!(i.encode(), [0x55, 0x04, 3, 0, 7, 0, 0, 0]);
        assert_eq!(Insn::new(LDX_W, 2, 1, 8, 0).encode(), [0x61, 0x12, 8, 0, 0, 0, 0, 0]);
    }
}
