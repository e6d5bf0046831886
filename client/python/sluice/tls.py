"""TLS settings for the Python client as PEM file paths, which survive
pickling into DataLoader workers (sluice._core reads the files), and a probe
of what an endpoint speaks.

Files come from the arguments or, when those are not given, from
SLUICE_CA_CERT / SLUICE_CLIENT_CERT / SLUICE_CLIENT_KEY (handy in a pod
spec). No CA = plaintext.
"""
import ipaddress
import os
import socket
import ssl


def tls_settings(ca_cert=None, client_cert=None, client_key=None):
    """(ca_cert, client_cert, client_key) paths after the environment
    fallback; ValueError naming the argument for an incomplete set."""
    ca_cert = ca_cert or os.environ.get("SLUICE_CA_CERT") or None
    client_cert = client_cert or os.environ.get("SLUICE_CLIENT_CERT") or None
    client_key = client_key or os.environ.get("SLUICE_CLIENT_KEY") or None
    if (client_cert is None) != (client_key is None):
        raise ValueError("client_cert and client_key must be given together")
    if client_cert is not None and ca_cert is None:
        raise ValueError("client_cert (mutual TLS) needs ca_cert to verify the server")
    return ca_cert, client_cert, client_key


def _target_entries(address):
    """(host, port) pairs of a gRPC target ("HOST:PORT", "[V6]:PORT",
    "ipv4:A:P,B:P", "dns:///H:P" or a comma-separated list)."""
    for prefix in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if address.startswith(prefix):
            address = address[len(prefix):]
    entries = []
    for entry in address.split(","):
        if "/" in entry:
            return []
        if entry.startswith("["):
            host, sep, port = entry[1:].partition("]:")
        else:
            host, sep, port = entry.rpartition(":")
        if sep and host and port:
            entries.append((host, port))
    return entries


def _answers_tls(sock, host):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    try:
        ipaddress.ip_address(host)
        server_hostname = None
    except ValueError:
        server_hostname = host
    try:
        with ctx.wrap_socket(sock, server_hostname=server_hostname) as tls_sock:
            return tls_sock.getpeercert(binary_form=True) is not None
    except (ssl.SSLError, OSError):
        return False


_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _answers_http2(sock):
    try:
        sock.sendall(_PREFACE)
        header = b""
        while len(header) < 9:
            chunk = sock.recv(9 - len(header))
            if not chunk:
                return False
            header += chunk
    except OSError:
        return False
    # 24-bit length, type 4 (SETTINGS), flags, stream 0.
    return header[3] == 4 and header[5:9] == bytes(4)


def probe_transport(address, timeout=1.0):
    """"tls", "plaintext" or None: what the endpoint at `address` speaks, by
    starting a TLS handshake (no verification: a server that answers with a
    certificate speaks TLS) and sending the HTTP/2 preface (a server that
    answers with SETTINGS speaks plaintext). None: nothing answered."""
    for host, port in _target_entries(address):
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            continue
        for family, kind, proto, _, sockaddr in infos:
            for probe in ("tls", "plaintext"):
                sock = socket.socket(family, kind, proto)
                try:
                    sock.settimeout(timeout)
                    sock.connect(sockaddr)
                except OSError:
                    sock.close()
                    break  # nothing there: the next address
                with sock:
                    if probe == "tls" and _answers_tls(sock, host):
                        return "tls"
                    if probe == "plaintext" and _answers_http2(sock):
                        return "plaintext"
    return None


def transport_mismatch(what, address, client_tls, hint="ca_cert / SLUICE_CA_CERT",
                       timeout=1.0):
    """After a failed connection: a message naming `what` at `address` when
    it speaks TLS and this client (TLS when `client_tls`) does not, or the
    reverse; None when they agree or the probe learns nothing."""
    transport = probe_transport(address, timeout)
    if transport == "tls" and not client_tls:
        return (f"{what} {address} speaks TLS, but this client connects in plaintext: give it "
                f"the CA that signed the server's certificate ({hint})")
    if transport == "plaintext" and client_tls:
        return (f"{what} {address} speaks plaintext, but this client connects with TLS ({hint} "
                f"is set): start the server with --tls_cert/--tls_key, or connect without a CA")
    return None
