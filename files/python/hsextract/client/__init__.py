"""The extraction client: turns a conversation dataset into prefill requests the capture dumps.

Modules, one job each: `dataset` (lines -> samples or rejects), `chat_template` (tokens + loss
mask from the model's own template), `sender` (HTTP with retries and health waits),
`backpressure` (when staging is too full to send), `progress` (counters, status file, summary),
`runner` (one run, resumable) and `command` (the ``hsextract extract`` CLI).
"""
