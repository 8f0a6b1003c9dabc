"""The ground floor: what every role imports and that imports no role.

    bus/             the event log: one interface, the embedded log and Kafka, typed events on it
    errors.py        the error tree, drawn whole
    objectstore.py   a local directory or S3; weight_versions.py: a version's files and manifest there
    telemetry.py     traces; metrics.py: OpenTelemetry metrics; trackers.py: each trainer step to
                     TensorBoard, MLflow, W&B, trackio
    http.py          the one HTTP client; http_service.py: what rollwire's HTTP servers share
    registry.py      named variants, checked at load
    processes.py     what every process does at start
    trace_blobs.py   traces too large for one event, kept in the object store

Above it stand the design's folders (schemas, producers, streams, consumers, trainer), and on top
`rollwire/` itself: the command and the run launcher, which import everything.
"""
