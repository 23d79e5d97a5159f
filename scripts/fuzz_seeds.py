#!/usr/bin/env python3
"""Builds the fuzz seed corpora (fuzz/seeds/<target>/) from fixtures/ (frames,
captures) and the example configs, in the input layout of each harness in src/fuzzing.rs."""
import glob
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "fuzz", "seeds")
# Builtin spec order (Spec::builtin_names) and length prefix order (PREFIXES).
SPECS = ["cups", "cup-pos", "visa-base1", "iso87ascii", "iso87binary"]
PREFIXES = ["binary2", "binary2-inclusive", "bcd2", "ascii4", "binary4", "visa4"]
SPEC_PREFIX = {"cups": "ascii4", "cup-pos": "binary2", "visa-base1": "visa4",
               "iso87ascii": "ascii4", "iso87binary": "binary2"}


def frames(prefix, stream):
    """Payloads of the frames of `stream` (binary2, ascii4 and visa4 only)."""
    at = 0
    while at < len(stream):
        if prefix == "binary2":
            n, head = int.from_bytes(stream[at:at + 2], "big"), 2
        elif prefix == "ascii4":
            n, head = int(stream[at:at + 4].decode()), 4
        else:
            n, head = int.from_bytes(stream[at:at + 2], "big"), 4
        yield stream[at + head:at + head + n]
        at += head + n


def write(target, name, data):
    os.makedirs(os.path.join(OUT, target), exist_ok=True)
    with open(os.path.join(OUT, target, name), "wb") as f:
        f.write(data)


# fuzzing::SERVICE_SPECS, by index (the dialect of the `service` target).
SERVICE_SPECS = ["cups", "cups-unstamped", "cup-pos", "visa-base1", "iso87ascii"]


def main():
    for path in sorted(glob.glob(os.path.join(ROOT, "fixtures", "*", "*.hex"))):
        spec = os.path.basename(os.path.dirname(path))
        if spec not in SPECS:
            continue
        text = "".join(l.split("#")[0] for l in open(path))
        stream = bytes.fromhex(text)
        name = f"{spec}-{os.path.basename(path)[:-4]}"
        prefix = SPEC_PREFIX[spec]
        write("frame_decoder", name, bytes([PREFIXES.index(prefix)]) + (4096).to_bytes(2, "big") + stream)
        for i, payload in enumerate(frames(prefix, stream)):
            if not payload:
                continue
            sel = bytes([SPECS.index(spec)])
            write("headers", f"{name}-{i}", payload)
            write("message", f"{name}-{i}", sel + payload)
            write("mask", f"{name}-{i}", sel + payload)
            write("decline", f"{name}-{i}", sel + b"96" + payload)
            if spec in SERVICE_SPECS and len(payload) < 256:
                # The switch's path: the fixture message as a client request.
                svc = bytes([SERVICE_SPECS.index(spec)])
                write("service", f"{name}-{i}", svc + bytes([0, len(payload)]) + payload)
    for i, spec in enumerate(SERVICE_SPECS):
        # A valid purchase, the same one mangled at byte 20, and a stray
        # node frame: each kind of step once.
        write("service", f"{spec}-steps-{i}", bytes([i, 1, 1, 0, 1, 2, 20, 0xFF, 2, 3, 0x30, 0x32, 0x31]))
    captures = glob.glob(os.path.join(ROOT, "fixtures", "**", "*.pcap"), recursive=True)
    captures += glob.glob(os.path.join(ROOT, "fixtures", "**", "*.pcapng"), recursive=True)
    for path in sorted(captures):
        with open(path, "rb") as f:
            write("pcap", os.path.basename(path), f.read())
    configs = glob.glob(os.path.join(ROOT, "examples", "*.toml"))
    configs.append(os.path.join(ROOT, "src", "ops", "default.toml"))
    for path in configs:
        with open(path, "rb") as f:
            write("config", os.path.basename(path), f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
