"""`virtplug up` with its Redfish service, for the Redfish tests: the real binary
($VIRTPLUG_BIN), loopback only, an ephemeral port for each listener, a data dir of its own.
Stopping it kills, by PID, only what it started: `up` and the QEMUs under its data dir.
"""
import http.server
import os
import queue
import re
import signal
import subprocess
import tempfile
import threading
import time

from kubernetes import client, config

GROUP, VERSION = "kubevirt.io", "v1"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUEST = os.environ.get("VIRTPLUG_GUEST_DIR", os.path.join(REPO, ".cache", "guest"))
# The test guest's kernel line (crates/virtplug/tests/node.rs): quiet, no TSC under TCG.
KERNEL_ARGS = "console=ttyS0 quiet panic=-1 mitigations=off no_timer_check tsc=unstable"


def wait_until(deadline_s, what, probe, every=0.2):
    """Calls `probe` until it returns something truthy; fails naming `what` after the deadline.
    (The service has no event stream to wait on; `every` bounds the polling rate.)"""
    end = time.monotonic() + deadline_s
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"waited {deadline_s} s for {what}")
        time.sleep(every)


class Up:
    def __init__(self, data_dir=None, extra_args=()):
        self._tmp = None if data_dir else tempfile.TemporaryDirectory()
        self.data_dir = data_dir or self._tmp.name
        self.extra_args = list(extra_args)
        self.proc = None
        self.start()

    def start(self):
        binary = os.environ.get("VIRTPLUG_BIN", os.path.join(REPO, "target", "debug", "virtplug"))
        args = [binary, "up", "--data-dir", self.data_dir, "--listen", "127.0.0.1:0",
                "--redfish-listen", "127.0.0.1:0", "--node-name", "redfish", "--accel", "tcg",
                "--boot-file-dir", GUEST, "--stop-vms-on-exit"] + self.extra_args
        log = open(os.path.join(self.data_dir, "stderr.log"), "ab")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(l) for l in self.proc.stdout], daemon=True).start()
        end = time.monotonic() + 120
        self.api_url = self.url = None
        while self.url is None:
            try:
                line = lines.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise AssertionError("virtplug up printed no Redfish URL within 120 s:\n" + self.stderr())
            m = re.search(r"serving the Kubernetes API at (https://\S+)", line)
            if m:
                self.api_url = m.group(1)
            m = re.search(r"Redfish \(a BMC per VM\) at (https://\S+)/redfish/v1/", line)
            if m:
                self.url = m.group(1)
        self.api = client.CustomObjectsApi(config.new_client_from_config(os.path.join(self.data_dir, "kubeconfig")))

    def stderr(self):
        with open(os.path.join(self.data_dir, "stderr.log"), errors="replace") as f:
            return f.read()[-4000:]

    @property
    def password(self):
        with open(os.path.join(self.data_dir, "redfish", "initial-admin-password")) as f:
            return f.read().strip()

    @property
    def ca(self):
        return os.path.join(self.data_dir, "pki", "ca.crt")

    def stop(self):
        """SIGINT (with --stop-vms-on-exit, `up` stops its VMs), then what is left, by PID."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        vmis = os.path.join(self.data_dir, "node", "vmis")
        for d in os.listdir(vmis) if os.path.isdir(vmis) else []:
            try:
                with open(os.path.join(vmis, d, "qemu.pid")) as f:
                    os.kill(int(f.read().strip()), signal.SIGKILL)
            except (OSError, ValueError):
                pass

    def close(self):
        self.stop()
        if self._tmp:
            self._tmp.cleanup()

    # --- VMs ---

    def create_vm(self, name, running=False, namespace="default", labels=None):
        spec = {"domain": {"resources": {"requests": {"memory": "256Mi"}}, "devices": {"disks": []}}, "volumes": []}
        if running:
            spec["terminationGracePeriodSeconds"] = 1
            spec["domain"]["firmware"] = {"kernelBoot": {"kernelArgs": KERNEL_ARGS, "container": {
                "kernelPath": os.path.join(GUEST, "vmlinuz"), "initrdPath": os.path.join(GUEST, "initramfs.cpio.gz")}}}
        vm = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VirtualMachine",
              "metadata": {"name": name, "labels": labels or {}},
              "spec": {"runStrategy": "Always" if running else "Halted", "template": {"spec": spec}}}
        return self.api.create_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachines", vm)

    def vmi(self, name, namespace="default"):
        try:
            return self.api.get_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachineinstances", name)
        except client.rest.ApiException as e:
            if e.status == 404:
                return None
            raise

    def console(self, vmi_uid):
        path = os.path.join(self.data_dir, "node", "vmis", vmi_uid, "serial.log")
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def qemu_running(self, vmi_uid):
        try:
            with open(os.path.join(self.data_dir, "node", "vmis", vmi_uid, "qemu.pid")) as f:
                os.kill(int(f.read().strip()), 0)
            return True
        except (OSError, ValueError):
            return False

    def wait_guest_ready(self, name, deadline_s=240, not_uid=None):
        """The VMI of `name` (another than `not_uid`) running, and its guest printed VP-READY."""
        vmi = wait_until(deadline_s, f"VMI {name} running", lambda: (lambda v: v if v and v.get("status", {}).get("phase") == "Running"
                         and v["metadata"]["uid"] != not_uid else None)(self.vmi(name)))
        uid = vmi["metadata"]["uid"]
        wait_until(deadline_s, f"the guest of {name} ready (VP-READY on its console)", lambda: "VP-READY" in self.console(uid))
        return uid


class Images:
    """A loopback HTTP server for the images: GUEST's files, answered after `delay` seconds, and
    the bad ones of the bad-input test. Records when each path was last fully served."""

    def __init__(self):
        self.delay = 0.0
        self.served = {}
        # Extra images by name (bytes), e.g. small media for the race harness.
        self.extra = {}
        # Bodies sent, by name.
        self.count = {}
        images = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_):
                pass

            def do_GET(self):
                time.sleep(images.delay)
                name = self.path.lstrip("/")
                if name == "huge.iso":
                    self.send_response(200)
                    self.send_header("Content-Length", str(64 << 30))
                    self.end_headers()
                    return
                if name == "disk.qcow2":
                    body = b"QFI\xfb" + b"\0" * 4092
                elif name in images.extra:
                    body = images.extra[name]
                elif name in ("boot-cd.iso", "boot-disk.img"):
                    with open(os.path.join(GUEST, name), "rb") as f:
                        body = f.read()
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                images.served[name] = time.time()
                images.count[name] = images.count.get(name, 0) + 1

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, name):
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def close(self):
        self.httpd.shutdown()


def connect(up, how=None):
    """A sushy connection to `up`'s Redfish service as admin (session, else Basic: as Ironic)."""
    import sushy
    from sushy import auth
    how = how or auth.SessionOrBasicAuth
    return sushy.Sushy(up.url + "/redfish/v1/", verify=up.ca, auth=how(username="admin", password=up.password))


def system_named(conn, name):
    """The System of VM `namespace/name`, through sushy."""
    for s in conn.get_system_collection().get_members():
        if s.name == name:
            return s
    raise AssertionError(f"no System named {name}")
