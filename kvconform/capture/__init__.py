"""Per-check captures of what crossed the harness's sockets: pcap, and for QUIC the qlog and the TLS key log.

``session`` owns a process's capture, ``hooks`` is what the lanes call (cheap to import: the rest loads only when
a capture is installed), ``pcap``/``tcpdump``/``relay``/``quic`` are its parts. The plugin side (options, keeping,
the evidence entry) is ``kvconform.fixtures.capture``.
"""

__all__ = ["MODES", "TOOLS"]

MODES = ("none", "failed", "all")  # --capture: record nothing; keep for checks that did not pass; keep all
TOOLS = ("auto", "tcpdump", "harness")  # --capture-with: how the pcap is taken
