"""MOQT draft-22 suites (moqt-d22-profile); one folder per role."""
