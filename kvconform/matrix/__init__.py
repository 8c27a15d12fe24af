"""The plugfest matrix (``kvconform matrix``): every registered implementation against every other.

An implementations registry (``registry.py``; schema ``testbeds/schema/implementations.schema.json``) says
who plays which role, in which versions, how the harness runs it and what it declares. ``plan.py`` lays out
the tables and their compatible cells (KVCS publisher x relay x consumer, TLKV prefill x decode and writer x
reader, KBTP initiator x target); ``cell.py`` runs one cell's end-to-end exchange in a worker process of its
own (``kvcs.py``, ``tlkv.py``, ``kbtp.py``); ``suites.py`` runs each implementation's role suites once;
``runner.py`` runs everything in parallel, judges failed cells by isolation against the reference and
writes the result (``kvconform.reports.matrix``: matrix.json and the matrix page).
"""
