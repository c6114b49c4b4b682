"""Small applications the contract runs in worker subprocesses (``wfe worker --app``)."""
