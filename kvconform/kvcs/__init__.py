"""KV Cache Streaming (KVCS) over MOQT: namespace, track names, the KVO1 object payload, the manifest and
its COSE signature, the test-content convention, and the reference publisher and consumer."""
