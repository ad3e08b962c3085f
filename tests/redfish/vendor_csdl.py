#!/usr/bin/env python3
"""Copies into tests/redfish/csdl the DMTF CSDL files that the Redfish service's $metadata
references, and every file those reference in turn (the DMTF validators resolve the whole
closure), plus DMTF's license file.

Usage: vendor_csdl.py METADATA_XML SOURCE_CSDL_DIR [DEST_DIR]
  METADATA_XML: the service's /redfish/v1/$metadata, saved to a file
  SOURCE_CSDL_DIR: DMTF's DSP8010 csdl/ folder (e.g. ../shared/redfish/csdl)
"""
import os
import re
import shutil
import sys

REF = re.compile(r'<edmx:Reference\s+Uri="([^"]+)"')


def refs(path):
    with open(path, encoding="utf-8") as f:
        return [u.rsplit("/", 1)[-1] for u in REF.findall(f.read())]


def main():
    metadata, src = sys.argv[1], sys.argv[2]
    dest = sys.argv[3] if len(sys.argv) > 3 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "csdl")
    todo, done, skipped = list(refs(metadata)), set(), set()
    while todo:
        name = todo.pop()
        # OASIS's OData vocabularies (Org.OData.*) and SNIA's Swordfish schemas are not in DMTF's
        # bundle; the validators check this service's payloads without them (no type served
        # comes from them).
        if name in done or name.startswith("Org.OData."):
            continue
        path = os.path.join(src, name)
        if not os.path.exists(path):
            skipped.add(name)
            continue
        done.add(name)
        todo.extend(refs(path))
    os.makedirs(dest, exist_ok=True)
    for name in sorted(done):
        shutil.copyfile(os.path.join(src, name), os.path.join(dest, name))
    shutil.copyfile(os.path.join(src, "LICENSE-DMTF.md"), os.path.join(dest, "LICENSE-DMTF.md"))
    print(f"{len(done)} schema files in {dest}; not in {src} (not DMTF's): {', '.join(sorted(skipped))}")


if __name__ == "__main__":
    main()
