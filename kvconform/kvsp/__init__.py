"""KVSP as KVCS uses it: the pluggable profile interface and the provisional profile (``profile.py``)."""

from kvconform.kvsp.jcs import jcs_canonical
from kvconform.kvsp.profile import ENTRY_POINT_GROUP, PROVISIONAL, KvspError, KvspProfile, ProvisionalKvsp, load_profile

__all__ = ["ENTRY_POINT_GROUP", "PROVISIONAL", "KvspError", "KvspProfile", "ProvisionalKvsp", "jcs_canonical",
           "load_profile"]
