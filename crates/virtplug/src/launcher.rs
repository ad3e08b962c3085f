//! `virtplug launcher`: the main process of a VMI's launcher pod (KubeVirt's virt-launcher).
//! It waits for the node agent on `RUN_DIR/launcher.sock`, starts QEMU as its child and exits
//! with QEMU's status ([`qemu::launcher`] has the protocol and its guarantees).

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
}

/// Runs the launcher on a current-thread runtime; the exit code is QEMU's (0 when stopped
/// before QEMU started, 1 when the launcher itself fails).
pub fn main(args: &LauncherArgs) -> ExitCode {
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
