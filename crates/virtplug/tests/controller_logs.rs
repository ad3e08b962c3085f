//! Every log line of the controller's work on a VM names the VM, through a `tracing` span
//! (not a hand-formatted prefix), in both log formats `virtplug --log-format` offers.
//!
//! One test per binary: it installs the process-wide subscriber (the controller's tasks run on
//! the runtime's worker threads, which a thread-local subscriber would miss).

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::TestServer;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;

use api::VirtualMachineInstance;

const T: Duration = Duration::from_secs(20);

/// A log sink shared with the test.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Sink {
    type Writer = Sink;
    fn make_writer(&'a self) -> Sink {
        self.clone()
    }
}

impl Sink {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap()).lines().map(str::to_owned).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controllers_log_lines_carry_the_vm_in_text_and_json() {
    let (text, json_sink) = (Sink::default(), Sink::default());
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("controller=info"))
        .with(tracing_subscriber::fmt::layer().with_ansi(false).with_writer(text.clone()))
        .with(tracing_subscriber::fmt::layer().json().with_writer(json_sink.clone()));
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let s = TestServer::start().await;
    let ctl = tokio::spawn(controller::run::run(client::in_process(s.server.local_router())));
    let _node = common::fakenode::start(&s.client, "node-a").await;
    let vms: Api<api::VirtualMachine> = Api::namespaced(s.client.clone(), "default");
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(s.client.clone(), "default");
    let mut vm = common::vm("logged");
    vm["spec"]["runStrategy"] = json!("Always");
    vms.create(&PostParams::default(), &serde_json::from_value(vm).unwrap()).await.unwrap();
    common::wait_until(T, "the VMI to run", || {
        let vmis = vmis.clone();
        async move { vmis.get_opt("logged").await.ok()?.filter(VirtualMachineInstance::is_running) }
    })
    .await;
    ctl.abort();

    let line = text.lines().into_iter().find(|l| l.contains("created its VMI")).expect("the creation is logged");
    assert!(line.contains("vm{vm=default/logged}"), "the text line names the VM through its span: {line}");
    let json_line = json_sink.lines().into_iter().find(|l| l.contains("created its VMI")).expect("the creation is logged as JSON");
    let v: Value = serde_json::from_str(&json_line).unwrap();
    assert_eq!(v["span"]["name"], "vm", "{v}");
    assert_eq!(v["span"]["vm"], "default/logged", "{v}");
    let scheduled = json_sink.lines().into_iter().find(|l| l.contains("scheduled its VMI")).expect("the scheduling is logged");
    let v: Value = serde_json::from_str(&scheduled).unwrap();
    assert_eq!((&v["span"]["vm"], &v["fields"]["node"]), (&json!("default/logged"), &json!("node-a")), "{v}");
}
