//! The process's allocator: mimalloc, told to give freed memory back to the system at once.
//!
//! Why not glibc's malloc: the API server allocates and frees a few KiB per request (the body,
//! the object as a tree, its encoding), and glibc consolidates its fast bins on every
//! allocation of 1 KiB or more (`malloc_consolidate`: 2.4 % of the server's CPU under the store
//! bench, the malloc family 15 %). With mimalloc the server spends ~15 % less CPU per update at
//! 8 writers and commits ~11 % more updates per second (BENCHMARKS.md "mimalloc").
//!
//! Why the two options: with mimalloc's defaults (freed pages kept for a second, whole arenas
//! committed where the OS overcommits) the API server sat at 65 MiB idle instead of glibc's 37;
//! with these it is at 40–45 MiB, and at 10,000 VMs it holds 1.7–2.2 KiB per KiB of stored JSON
//! after the lists instead of glibc's 3.0–3.7. Only Rust's allocations go to mimalloc: C code
//! (SQLite, liblzma) keeps glibc's malloc, which `apiserver::heap` still trims after bursts of
//! writes.
//!
//! The options are defaults: `MIMALLOC_ARENA_EAGER_COMMIT` and `MIMALLOC_PURGE_DELAY` in the
//! environment still override them (to A/B mimalloc's own defaults without a rebuild).

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's option numbers, from `mi_option_e` in its `mimalloc.h` (the v3 sources that
/// libmimalloc-sys 0.1.49 builds; v2 numbers them the same). The crate names neither; it is
/// pinned (`=0.1.49`) so that an upgrade is a deliberate change, and the test below checks
/// `purge_delay` by its effect.
const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// [`configure_before_main`], run by the C runtime before `main` and before Rust's first allocation (an
/// `.init_array` entry): mimalloc reserves its first arena on the first allocation, and reads
/// `arena_eager_commit` then.
// SAFETY (of placing a function in `.init_array`): the loader calls each entry once, on the
// main thread, before `main`, while the process has one thread, as `f(argc, argv, envp)`;
// extra arguments to a C-ABI function that takes none are harmless. `configure_before_main`
// needs nothing of Rust's runtime set-up, allocates nothing, and cannot unwind (an `extern "C"`
// function aborts on a panic; it has none). Its order against other constructors (mimalloc's
// own `mi_process_attach` among them) does not matter: it only writes mimalloc's static option
// table, which needs no initialisation and is read on each arena reservation and each purge.
#[allow(unsafe_code)]
#[used]
#[link_section = ".init_array"]
static CONFIGURE_BEFORE_MAIN: extern "C" fn() = configure_before_main;

/// Sets mimalloc's defaults: arenas committed as they are used, freed pages purged at once.
/// Runs before `main` ([`CONFIGURE_BEFORE_MAIN`]), while the process has one thread.
#[allow(unsafe_code)]
extern "C" fn configure_before_main() {
    // SAFETY: `mi_option_set_default` stores an integer into mimalloc's option table unless
    // the environment already set that option; both numbers are options of the mimalloc this
    // crate links (see above), and any value is valid for them (0 = off / no delay). The table
    // is not synchronised, which is why this runs before any other thread exists (from
    // `.init_array`, before `main`).
    unsafe {
        libmimalloc_sys::mi_option_set_default(ARENA_EAGER_COMMIT, 0);
        libmimalloc_sys::mi_option_set_default(PURGE_DELAY, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's resident set, MiB.
    fn resident_mib() -> f64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: f64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * f64::from(u32::try_from(rustix::param::page_size()).unwrap()) / f64::from(1u32 << 20)
    }

    #[test]
    #[allow(unsafe_code)]
    fn the_options_are_set_before_main_and_freed_memory_leaves_at_once() {
        // SAFETY: `mi_option_get` reads an integer from mimalloc's option table; both numbers
        // are options of the linked mimalloc.
        let (eager, delay) = unsafe { (libmimalloc_sys::mi_option_get(ARENA_EAGER_COMMIT), libmimalloc_sys::mi_option_get(PURGE_DELAY)) };
        assert_eq!((eager, delay), (0, 0), "the .init_array hook did not run before the test (or MIMALLOC_* is set)");
        // What option 15 is, shown by its effect: 64 MiB touched, then freed, is no longer
        // resident right after the free (mimalloc's default keeps it for a second).
        let before = resident_mib();
        let blocks: Vec<Vec<u8>> = (0..256).map(|i| vec![u8::try_from(i % 251).unwrap() + 1; 256 << 10]).collect();
        let held = resident_mib();
        assert!(held - before > 48.0, "64 MiB touched: {before:.1} → {held:.1} MiB resident");
        drop(blocks);
        let after = resident_mib();
        assert!(held - after > 48.0, "64 MiB freed: {held:.1} → {after:.1} MiB resident");
    }
}
