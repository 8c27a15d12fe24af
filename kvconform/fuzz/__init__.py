"""The fuzz lane: every parser the harness runs on bytes a target sends, fed hostile input.

A parser may only answer malformed bytes with its typed decode error.  Anything else it raises, an
input it does not finish within the time bound and one that makes it allocate past the memory bound
crash the harness (and turn a verdict into garbage), so each is a finding.

- ``target``: :class:`FuzzTarget` (one parser: callable, accepted errors, seed corpus, mutation hints);
- ``registry``: every registered parser by name (``parsers/<protocol>.py`` declare them), and the
  parsers whose known crash classes another change is fixing;
- ``mutate``: the seeded, structure-aware mutator of the pure-Python engine;
- ``worker`` / ``engine``: the bounded child process that runs inputs and the parent that drives it;
- ``atheris_run``: the coverage-guided engine (libFuzzer through atheris) when it is installed;
- ``finding`` / ``corpus``: crash records (seed, input hex, replay) and corpus folders;
- ``tool``: ``kvconform fuzz ...``.

Nothing here is imported by ``kvconform`` itself: the package stays light so atheris can instrument the
parser modules when it imports them.
"""
