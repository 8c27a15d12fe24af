"""moqt-relay: a MOQT relay as KVCS uses it (moqt-d22-profile sections 11 and 12), driven over real QUIC."""
