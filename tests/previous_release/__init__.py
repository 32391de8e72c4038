"""The lock scripts of the release before this one (as they were at the commit before the
grant lease), for the tests that run this release beside it (a rolling deploy)."""
