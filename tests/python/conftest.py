"""Fixtures the virtual-media tests share: the loopback image server and a `virtplug up` that
may import from it (imports refuse loopback unless allowed). A test module that defines its own
`up` uses that one instead."""
import pytest

from redfish_up import Images, Up


@pytest.fixture(scope="module")
def images():
    i = Images()
    try:
        yield i
    finally:
        i.close()


@pytest.fixture(scope="module")
def up():
    u = Up(extra_args=["--import-allow-host", "127.0.0.1"])
    try:
        yield u
    finally:
        u.close()
