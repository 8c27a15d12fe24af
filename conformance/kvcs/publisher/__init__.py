"""kvcs-publisher suite: the harness plays the relay the publisher under test publishes to."""
