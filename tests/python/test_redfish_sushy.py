"""sushy — the Redfish client OpenStack Ironic drives BMCs with — against the Redfish service of
a real `virtplug up`: session and Basic login, the system list, and power off and on through
`reset_system` with PowerState polling, on a VM whose QEMU guest (the test guest under TCG)
really stops and boots again: asserted from QEMU's process and the guest's own console.
"""
import pytest
import sushy
from sushy import auth

from redfish_up import Up, connect, system_named, wait_until


@pytest.fixture(scope="module")
def up():
    u = Up()
    try:
        yield u
    finally:
        u.close()


@pytest.fixture(autouse=True)
def own_ca(monkeypatch):
    # requests prefers these over sushy's own `verify` (the service's CA).
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)


def test_session_and_basic_login_list_the_systems(up):
    up.create_vm("listed-0")
    uids = set()
    for how in (auth.SessionAuth, auth.BasicAuth):
        conn = connect(up, how)
        s = system_named(conn, "default/listed-0")
        uids.add(s.identity)
        assert s.manufacturer == "virtplug"
        assert s.power_state == sushy.PowerState.OFF
        assert s.managers[0].identity == s.identity, "Links.ManagedBy: the VM's own Manager"
    assert len(uids) == 1
    # The session login really made a session, and sushy's token works for it.
    conn = connect(up, auth.SessionAuth)
    assert conn.get_session_service().sessions.members_identities


def test_reset_system_powers_a_real_guest_off_and_on(up):
    up.create_vm("power-0", running=True)
    first = up.wait_guest_ready("power-0")
    conn = connect(up, auth.SessionOrBasicAuth)
    system = system_named(conn, "default/power-0")
    assert system.power_state == sushy.PowerState.ON

    system.reset_system(sushy.ResetType.FORCE_OFF)

    def off():
        system.refresh()
        return system.power_state == sushy.PowerState.OFF
    wait_until(90, "PowerState Off after ForceOff", off)
    assert not up.qemu_running(first), "the guest's QEMU is gone"
    assert up.vmi("power-0") is None

    # Ironic's ForceOff again on an Off system: satisfied, so a success.
    system.reset_system(sushy.ResetType.FORCE_OFF)

    system.reset_system(sushy.ResetType.ON)

    def on():
        system.refresh()
        return system.power_state == sushy.PowerState.ON
    wait_until(240, "PowerState On after On", on)
    second = up.wait_guest_ready("power-0", not_uid=first)
    assert second != first and up.qemu_running(second), "a new QEMU booted the guest again"
