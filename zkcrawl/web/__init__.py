"""The web layer, from URL to record: :mod:`.urls` (normalization, link filters),
:mod:`.robots` (robots.txt cache), :mod:`.fetch` (the fetch policy: robots, politeness,
redirects, retries, outcomes), :mod:`.transports` (the bytes: libcurl or requests, one per
thread), :mod:`.decode` (charset), :mod:`.extract` (lxml: title, fields, links). No ZooKeeper
here."""
