//! `virtplug launcher`: the main process of a VMI's launcher pod (KubeVirt's virt-launcher).
//! It creates the `disk.img` of each empty Filesystem boot claim (`--disk`, [`crate::disk_flag`],
//! as virt-launcher does), then waits for the node agent on `RUN_DIR/launcher.sock`, starts QEMU
//! as its child and exits with QEMU's status ([`qemu::launcher`] has the protocol and its
//! guarantees). The images are made before the socket exists: the agent, which starts QEMU only
//! once the socket is there, never finds a claim without its image.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

/// Arguments of `virtplug launcher` (the controller writes them into the pod).
#[derive(Args)]
pub struct LauncherArgs {
    /// The VMI's UID (for the logs; the run dir names it too).
    #[arg(long)]
    uid: String,
    /// The VMI's run dir (a hostPath the node agent sees at the same path).
    #[arg(long)]
    run_dir: PathBuf,
    /// How long the guest gets to power off when the pod is deleted (SIGTERM) before QEMU is
    /// stopped: the VMI's `terminationGracePeriodSeconds` (KubeVirt's default, 30).
    #[arg(long, default_value_t = qemu::launcher::DEFAULT_GRACE.as_secs())]
    grace_period_seconds: u64,
    /// `PATH=BYTES` (repeatable): create the Filesystem boot claim's image PATH, sparse, BYTES
    /// long, if missing (the controller passes one per Filesystem boot claim, its size).
    #[arg(long = "disk", value_parser = crate::disk_flag::parse)]
    disks: Vec<crate::disk_flag::Disk>,
}

/// Runs the launcher on a current-thread runtime; the exit code is QEMU's (0 when stopped
/// before QEMU started, 1 when the launcher itself fails).
pub fn main(args: &LauncherArgs) -> ExitCode {
    if let Err(e) = crate::disk_flag::ensure_all(&args.disks) {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let span = tracing::info_span!("launcher", vmi.uid = %args.uid);
    let _entered = span.enter();
    match runtime.block_on(qemu::launcher::serve(&args.run_dir, std::time::Duration::from_secs(args.grace_period_seconds))) {
        Ok(qemu::launcher::Ended::Qemu(code)) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Ok(qemu::launcher::Ended::Stopped) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", client::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: LauncherArgs,
    }

    /// The pod's command line as the controller writes it: one `--disk` per Filesystem boot
    /// claim; a malformed one stops the launcher before anything runs, naming the flag.
    #[test]
    fn disks_are_repeatable_and_a_bad_one_names_the_flag() {
        let base = ["launcher", "--uid", "u1", "--run-dir", "/run/vmis/u1"];
        let cli = Cli::try_parse_from(base.iter().copied().chain([
            "--disk",
            "/run/kubevirt-private/vmi-disks/root/disk.img=67108864",
            "--disk",
            "/run/kubevirt-private/vmi-disks/data/disk.img=1024",
        ]))
        .unwrap();
        let got: Vec<(String, u64)> = cli.args.disks.iter().map(|d| (d.path.display().to_string(), d.bytes)).collect();
        assert_eq!(
            got,
            [
                ("/run/kubevirt-private/vmi-disks/root/disk.img".to_owned(), 64 << 20),
                ("/run/kubevirt-private/vmi-disks/data/disk.img".to_owned(), 1024)
            ]
        );
        assert!(Cli::try_parse_from(base).unwrap().args.disks.is_empty(), "no boot claims, no --disk");
        let e = Cli::try_parse_from(base.iter().copied().chain(["--disk", "disk.img=1"])).err().unwrap().to_string();
        assert!(e.contains("--disk") && e.contains("absolute"), "{e}");
    }
}
