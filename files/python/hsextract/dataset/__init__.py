"""The dataset library: a user's prompt set read as samples, by `hsextract extract`, `plan`,
`regenerate` and `collect` alike.

* `sources`, `json_array`: dataset files of every shape (JSONL, JSON arrays, Parquet, Arrow,
  compressed or not), read as one stream of rows that know where they came from;
* `reader`: rows into samples or rejects with stable indices (`read_dataset`, `count_rows`);
* `conversation`: the chat shapes (ShareGPT, OpenAI, tool calls, reasoning) as one message list;
* `chat_template`, `tokenizer_files`, `direct_tokenizer`, `head_tokens`: a conversation into the
  token ids and loss mask the server is sent, as the served model's template renders it;
* `defaults`: the limits of a run (tokens, lengths), one source for every command that sizes one.

What a run does with the samples lives in `hsextract.client` (extraction) and `hsextract.regen`.
"""
