"""TLS for the Python client from PEM files, so that settings survive
pickling into DataLoader workers (grpc credentials objects do not).

Files come from the arguments or, when those are not given, from
SLUICE_CA_CERT / SLUICE_CLIENT_CERT / SLUICE_CLIENT_KEY (handy in a pod
spec). No CA = plaintext.
"""
import os

import grpc


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


def _read(path, name):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{name}: cannot read {path}: {e.strerror}") from e


def channel_credentials(ca_cert=None, client_cert=None, client_key=None):
    """grpc.ChannelCredentials for the files, or None for plaintext."""
    ca_cert, client_cert, client_key = tls_settings(ca_cert, client_cert, client_key)
    if ca_cert is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca_cert, "ca_cert"),
        private_key=_read(client_key, "client_key") if client_key else None,
        certificate_chain=_read(client_cert, "client_cert") if client_cert else None)


# A channel following the ready coordinator: round_robin over the addresses
# whose gRPC health service reports "readiness" SERVING (see
# coordinator_channel).
_FOLLOW_READY_SERVICE_CONFIG = (
    '{"loadBalancingConfig":[{"round_robin":{}}],'
    '"healthCheckConfig":{"serviceName":"readiness"}}')


def _target(address):
    return "ipv4:" + address if "," in address else address


def may_name_several(address):
    """True when `address` is a comma-separated list, or a host name (not an
    IP literal, not a target with a scheme) that may resolve to several."""
    if "," in address:
        return True
    if not address or ":/" in address or address.startswith("["):
        return False
    host = address.rpartition(":")[0] if ":" in address else address
    return bool(host) and any(c not in "0123456789." for c in host)


def channel(address, credentials=None, options=None):
    """A channel to one "HOST:PORT" (or the first of several comma-separated
    IPv4 ones that accepts)."""
    address = _target(address)
    if credentials is not None:
        return grpc.secure_channel(address, credentials, options=options)
    return grpc.insecure_channel(address, options=options)


def coordinator_channel(address, credentials=None, options=None):
    """A channel to the coordinator(s) at `address`: one "HOST:PORT", or
    several comma-separated IPv4 ones. With several, or a host name, the
    channel sends each call to whichever address reports readiness SERVING:
    with the journal in etcd only the leading coordinator does (standbys
    answer UNAVAILABLE naming it), so the channel follows the leader."""
    options = list(options or [])
    if may_name_several(address):
        options.append(("grpc.service_config", _FOLLOW_READY_SERVICE_CONFIG))
    return channel(address, credentials, options)
