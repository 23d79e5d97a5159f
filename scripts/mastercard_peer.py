#!/usr/bin/env python3
"""An independent Mastercard peer: pyiso8583 and the Mastercard table of
scripts/differential.py (written from Shulyaka/iso8583tools, not from
specs/mastercard.toml), nothing of isoswitch's code.

It plays Mastercard on one duplex link that a real `isoswitch run` dials
(`connect` front, spec `mastercard`, in front of two `isoswitch sim node`
hosts), and checks, byte for byte, what a bank connecting to Mastercard
must do on the wire:

- the switch signs the link on: 0800 with DE 70 061 and the member's DE 33,
  which the peer answers 0810 DE 39 00;
- the switch answers the peer's echo test (0800 DE 70 270) itself: an 0810
  whose bytes are the peer's own encoding of the answer it expects (the
  request's echoed fields and DE 39 00);
- the peer's issuer requests (0100, with DE 48 subelements, DE 61, DE 63)
  reach a node and come back answered on the same link: each 0110 equals,
  byte for byte, the peer's own encoding of the answer (every request field,
  DE 39 00; a node answers as `sim node` does);
- the switch's echo tests (DE 70 270) come now and then: answered 0810.

    scripts/mastercard_peer.py [--isoswitch PATH] [--requests N]

Exit status 0 when every check holds, 1 otherwise (each difference printed).
"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import differential  # noqa: E402  (the Mastercard table, and pyiso8583)

iso8583 = differential.iso8583
SPEC = differential.pyiso_spec("mastercard")
MEMBER_ID = "001234"
# Fields the switch's echo answer copies from its request ([network]
# echo_fields of the dialect, as the public interface descriptions have
# network management answers echo them).
ECHO_FIELDS = ["7", "11", "33", "70"]


def encode(doc):
    body, _ = iso8583.encode(dict(doc), SPEC)
    return bytes(body)


def decode(body):
    doc, _ = iso8583.decode(body, SPEC)
    return {k: v for k, v in doc.items() if k == "t" or k.isdigit()}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Link:
    """One framed duplex link: 2-byte big-endian length, then the message."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def send(self, body):
        self.sock.sendall(len(body).to_bytes(2, "big") + body)

    def recv(self, deadline):
        while True:
            if len(self.buf) >= 2:
                n = int.from_bytes(self.buf[:2], "big")
                if len(self.buf) >= 2 + n:
                    body, self.buf = self.buf[2:2 + n], self.buf[2 + n:]
                    if n == 0:
                        continue  # keep-alive
                    return body
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame in time")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the switch closed the link")
            self.buf += chunk


def answer_of(request, fields=None, code="00"):
    """The answer a Mastercard member or network builds: response MTI, the
    request's fields (or those named), DE 39."""
    mti = request["t"]
    doc = {"t": mti[:2] + str(int(mti[2]) + 1) + mti[3]}
    for k, v in request.items():
        if k.isdigit() and (fields is None or k in fields):
            doc[k] = v
    doc["39"] = code
    return doc


def issuer_request(stan):
    return {
        "t": "0100",
        "2": "5413330089010012",
        "3": "000000",
        "4": f"{100 + stan:012d}",
        "7": time.strftime("%m%d%H%M%S", time.gmtime()),
        "11": f"{stan:06d}",
        "12": "120000",
        "13": "1206",
        "22": "051",
        "32": "001234",
        "37": f"P{stan:011d}",
        "41": "PTERM001",
        "42": "PYMERCHANT00001",
        # Category code R, subelements 20 (S), 87 (M).
        "48": "R2001S8701M",
        "49": "840",
        "61": "000000000010084012345",
        "63": f"MCC{stan:06d}",
    }


def run(args):
    failures = []
    tmp = tempfile.mkdtemp(prefix="mc-peer-")
    peer_port = free_port()
    node_ports = [free_port(), free_port()]
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", peer_port))
    listener.listen(4)
    config = os.path.join(tmp, "switch.toml")
    nodes_toml = "".join(
        f'[[service.back.node]]\nid = "0{i + 1}"\naddress = "127.0.0.1:{p}"\n'
        for i, p in enumerate(node_ports))
    with open(config, "w") as f:
        f.write(
            '[[service]]\nname = "mastercard"\nspec = "mastercard"\n'
            'f37_stamp = { offset = 10, width = 2 }\n'
            '[service.front]\nkind = "connect"\n'
            f'connect = "127.0.0.1:{peer_port}"\nlinks = 1\nsign_on = "per-link"\n'
            'sign_on_retry = "500ms"\necho_interval = "1s"\n'
            f'[service.network]\nfields = {{ F33 = "{MEMBER_ID}" }}\n'
            '[service.back]\nconnections_per_node = 1\n' + nodes_toml)
    env = dict(os.environ, ISOSWITCH_LOG="warn")
    procs = [subprocess.Popen(
        [args.isoswitch, "sim", "node", "--listen", f"127.0.0.1:{p}", "--spec", "mastercard",
         "--id", f"0{i + 1}"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for i, p in enumerate(node_ports)]
    try:
        time.sleep(0.3)  # the nodes bind before the switch dials them
        procs.append(subprocess.Popen(
            [args.isoswitch, "run", "--config", config, "--data-dir", os.path.join(tmp, "data")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        listener.settimeout(15)
        conn, _ = listener.accept()
        link = Link(conn)
        deadline = time.monotonic() + 30
        signed_on = echoes_from_switch = 0

        def network_request(msg):
            nonlocal signed_on, echoes_from_switch
            f70 = msg.get("70")
            if f70 == "061":
                signed_on += 1
                if msg.get("33") != MEMBER_ID:
                    failures.append(f"sign-on DE 33 {msg.get('33')!r}, want {MEMBER_ID}")
            elif f70 == "270":
                echoes_from_switch += 1
            link.send(encode(answer_of(msg, fields=ECHO_FIELDS)))

        # 1. The switch signs the link on.
        while not signed_on:
            msg = decode(link.recv(deadline))
            if msg["t"] == "0800":
                network_request(msg)
        # Let the switch's node connections come up.
        time.sleep(1.0)

        # 2. Our echo test, answered by the switch itself, byte for byte.
        echo = {"t": "0800", "7": time.strftime("%m%d%H%M%S", time.gmtime()),
                "11": "900001", "33": "009999", "70": "270"}
        link.send(encode(echo))
        # 3. Issuer requests, each answered by a node on this link.
        want = {"900001": encode(answer_of(echo, fields=ECHO_FIELDS))}
        for i in range(args.requests):
            req = issuer_request(i + 1)
            want[req["11"]] = encode(answer_of(req))
            link.send(encode(req))
        while want and time.monotonic() < deadline:
            try:
                body = link.recv(deadline)
            except TimeoutError:
                break
            msg = decode(body)
            if msg["t"] == "0800":
                network_request(msg)
                continue
            expected = want.pop(msg.get("11"), None)
            if expected is None:
                failures.append(f"an answer for no request: {msg['t']} DE 11 {msg.get('11')}")
            elif body != expected:
                failures.append(
                    f"{msg['t']} DE 11 {msg.get('11')}: bytes differ\n  got  {body.hex()}\n"
                    f"  want {expected.hex()}\n  got fields {msg}\n  want fields "
                    f"{decode(expected)}")
        for stan in want:
            failures.append(f"no answer to DE 11 {stan}")
        print(f"mastercard peer: sign-ons {signed_on}, switch echoes {echoes_from_switch}, "
              f"{args.requests} issuer requests + 1 echo, {len(failures)} differences")
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        listener.close()
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--isoswitch", default="target/debug/isoswitch")
    ap.add_argument("--requests", type=int, default=50)
    args = ap.parse_args()
    failures = run(args)
    for f in failures[:15]:
        print("   ", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
