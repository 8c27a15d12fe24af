"""KVCS drivers, one module per role: ``publisher`` (kvcs-publisher) and ``consumer`` (kvcs-consumer).
A relay under kvcs-relay is driven like any MOQT relay (``kvconform.targets.moqt``)."""
