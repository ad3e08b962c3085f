"""KubeVirt's console and VNC subresources with the websocket client KubeVirt's Python users have
(`websocket-client`, which the `kubernetes` client's `stream` module uses): the handshake with
the `plain.kubevirt.io` subprotocol, the kubeconfig's bearer token and CA, and raw bytes in
binary frames. Real `virtplug up` ($VIRTPLUG_BIN), real QEMU (TCG), the test guest, which
answers each line typed on its console with `VP-ECHO <line>`. `up` is conftest's fixture.
"""
import base64
import os
import ssl
import time

import pytest
import websocket
import yaml

SUB = "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances"


def connect(up, name, sub):
    with open(os.path.join(up.data_dir, "kubeconfig")) as f:
        kc = yaml.safe_load(f)
    server = kc["clusters"][0]["cluster"]["server"]
    ca = base64.b64decode(kc["clusters"][0]["cluster"]["certificate-authority-data"]).decode()
    ctx = ssl.create_default_context(cadata=ca)
    return websocket.create_connection(
        server.replace("https://", "wss://") + f"{SUB}/{name}/{sub}",
        header=[f"Authorization: Bearer {kc['users'][0]['user']['token']}"],
        subprotocols=["plain.kubevirt.io"],
        sslopt={"context": ctx},
        timeout=90,
    )


def read_until(ws, want, deadline_s=90):
    got = b""
    end = time.monotonic() + deadline_s
    while want not in got:
        if time.monotonic() > end:
            raise AssertionError(f"no {want!r} within {deadline_s} s; got {got[-400:]!r}")
        opcode, data = ws.recv_data()
        assert opcode == websocket.ABNF.OPCODE_BINARY, f"binary frames only, got opcode {opcode}"
        got += data
    return got


def test_console_and_vnc_with_websocket_client(up):
    up.create_vm("pyconsole", running=True)
    up.wait_guest_ready("pyconsole")
    ws = connect(up, "pyconsole", "console")
    try:
        assert ws.subprotocol == "plain.kubevirt.io"
        ws.send_binary(b"from python\n")
        read_until(ws, b"VP-ECHO from python")
    finally:
        ws.close()
    vnc = connect(up, "pyconsole", "vnc")
    try:
        assert read_until(vnc, b"\n")[:12] == b"RFB 003.008\n"
    finally:
        vnc.close()


def test_refusals_are_statuses_before_the_upgrade(up):
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        connect(up, "nosuch", "console")
    assert e.value.status_code == 404
