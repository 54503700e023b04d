"""The lake and session plumbing: column names and schemas, the SparkSession, the :class:`~ai4dl.lake.tables.Lake`
handle (tables by logical name; atomic overwrite, MERGE, properties, versions, the run log)."""
