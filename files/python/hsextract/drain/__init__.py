"""The drain daemon: staged dumps in /dev/shm -> validated, durable training-set files + manifest."""
