"""Runs DMTF's redfish-protocol-validator (its own `main`, arguments as on its command line)
with SSDP discovery turned off: the tool has no option for it and sends M-SEARCH to the
multicast groups 239.255.255.250 and ff02::c, which must not leave this machine. Its SSDP
checks then report NOT_TESTED (the service implements no SSDP, so on a network they would find
nothing either)."""
import sys

import redfish_protocol_validator.utils as utils

utils.discover_ssdp = lambda *args, **kwargs: set()

from redfish_protocol_validator.console_scripts import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "rf_protocol_validator"
    sys.exit(main())
