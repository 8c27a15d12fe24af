"""MOQT draft-22 (ALPN ``moqt-22``, see ``quic.ALPN``) as used by KVCS.

Sans-I/O codec: ``vi64`` (integers and the byte cursor), ``errors`` (code registries, decode error),
``structures`` (Location, names, KVPs, tokens), ``filters``, ``parameters`` (incl. FILL_PARAMETERS),
``messages`` (control messages),
``data`` (subgroup/fetch streams, datagrams); ``craft`` builds malformed messages for negative tests.
``lifecycle`` is the request lifecycle table the session follows.
The session, QUIC and relay layers are built on them.  Wire reference: ``spec/moqt-d22-profile.md``.
"""
