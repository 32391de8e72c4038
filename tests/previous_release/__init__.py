"""The scripts of the release before this one, for the tests that run this release beside
it (a rolling deploy): its lock scripts as they were at the commit before the grant lease,
its finish and enqueue scripts as they were at the commit before the finish protocol."""
