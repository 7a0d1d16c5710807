"""An example zkcrawl extension: a page processor for the bundled sample blog and a result
pipeline (README, Extending zkcrawl)."""
