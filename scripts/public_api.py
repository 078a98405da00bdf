#!/usr/bin/env python3
"""Lists the public API of the crate from rustdoc's JSON output, one line per path.

Usage: public_api.py <crate.json>

Walks the module tree from the crate root through public modules and public `use`
re-exports (rustdoc inlines items re-exported from private modules), and prints every
reachable item as `<kind> <path>`. Exits 1, after the listing, if any item is reachable
through more than one path: the crate's rule is one public path per item.
"""
import json
import sys
from collections import defaultdict

KINDS = ("module", "struct", "enum", "trait", "function", "constant", "static",
         "type_alias", "macro", "union", "trait_alias", "proc_macro", "primitive")


def kind_of(item):
    inner = item.get("inner", {})
    return next(iter(inner), "?")


def main():
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    index = doc["index"]
    paths = defaultdict(set)  # item id -> set of paths
    kinds = {}
    visiting = set()

    def public(item):
        return item.get("visibility") == "public"

    def walk(module_id, prefix):
        if (module_id, prefix) in visiting:
            return
        visiting.add((module_id, prefix))
        module = index.get(str(module_id))
        if module is None:
            return
        for child_id in module["inner"]["module"]["items"]:
            child = index.get(str(child_id))
            if child is None:
                continue
            kind = kind_of(child)
            if kind in ("use", "import"):
                use = child["inner"][kind]
                if not public(child):
                    continue
                target_id = use.get("id")
                target = index.get(str(target_id)) if target_id is not None else None
                if use.get("is_glob") or use.get("glob"):
                    if target is not None and kind_of(target) == "module":
                        walk(target_id, prefix)
                    continue
                if target is None:
                    # a re-export of an external item: listed by its source path
                    name = f"{prefix}::{use['name']}"
                    paths[f"extern:{use['source']}"].add(name)
                    kinds[f"extern:{use['source']}"] = "extern"
                    continue
                record(target_id, target, f"{prefix}::{use['name']}")
                continue
            if not public(child) or kind not in KINDS:
                continue
            record(child_id, child, f"{prefix}::{child['name']}")

    def record(item_id, item, path):
        kind = kind_of(item)
        paths[str(item_id)].add(path)
        kinds[str(item_id)] = kind
        if kind == "module":
            walk(item_id, path)

    root = doc["root"]
    walk(root, index[str(root)]["name"])

    lines = sorted(f"{kinds[i]} {p}" for i, ps in paths.items() for p in ps)
    print("\n".join(lines))
    dupes = sorted(sorted(ps) for i, ps in paths.items() if len(ps) > 1)
    if dupes:
        print("\nitems with more than one public path:", file=sys.stderr)
        for ps in dupes:
            print("  " + "  =  ".join(ps), file=sys.stderr)
        return 1
    print(f"\n{len(lines)} public paths, one per item.", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
