"""Page processors and result pipelines loaded by name (``tests.plugins.procs:...``) in the
extension tests, as a user's package would be."""
