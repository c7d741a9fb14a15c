#!/usr/bin/env python3
"""Counts the library's public items by kind, from rustdoc's list of all
items (`target/doc/fusegrad/all.html`, written by `cargo doc --no-deps -p
fusegrad`), and lists the public modules.

Usage: scripts/public_items.py [DOC_DIR]   (default: target/doc/fusegrad)
"""
import html
import os
import re
import sys

doc = sys.argv[1] if len(sys.argv) > 1 else os.path.join("target", "doc", "fusegrad")
text = open(os.path.join(doc, "all.html"), encoding="utf-8").read()
# Each section: <h3 id="structs">Structs</h3><ul class="all-items"><li><a href="...">path</a></li>...
sections = re.findall(r'<h3 id="([a-z-]+)">([^<]+)</h3>\s*<ul class="all-items">(.*?)</ul>', text, re.S)
total = 0
modules = set()
for _, title, body in sections:
    items = [html.unescape(re.sub(r"<[^>]+>", "", i)) for i in re.findall(r"<a [^>]*>(.*?)</a>", body)]
    total += len(items)
    for i in items:
        parts = i.split("::")
        for n in range(1, len(parts)):
            modules.add("::".join(parts[:n]))
    print(f"{title}: {len(items)}")
print(f"total: {total}")
print(f"modules with public items: {len(modules)}")
for m in sorted(modules):
    print(f"  {m}")
