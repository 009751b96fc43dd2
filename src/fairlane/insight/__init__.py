"""What the faces tell of a job: the narrative read from the store's records and read
models, with no reads of its own (the caller passes what it read).

- ``explain``: where a job's time went and why, ``explain(record, events)``; its steps
  are ``timeline`` (the logged events and those the record implies), ``walk`` (the
  timeline cut into segments, each with what the job was doing and why), ``words``
  (durations and dispatch's view of a wait), ``rates`` (a job's rate keys now) and
  ``globalkeys`` (a key shared by the shards of an app: the part its shard holds).
- ``runview``: one durable workflow run, its steps, slices and waits, as ``fairlane
  runs show`` prints it and the dashboard serves it.

``fairlane explain``, ``fairlane runs show`` and the dashboard's job page read it; the
worker and the store never do.
"""
