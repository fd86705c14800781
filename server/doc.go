// Package server is dflash-mlx's HTTP API: OpenAI's chat completions, completions and
// Responses, and Anthropic's Messages.
//
// Its one job is HTTP: decode and validate requests, queue them, run as many generations at
// once as the Backend batches, and answer in each API's JSON and SSE shapes. It knows
// nothing about MLX, models or tokenizers: the engine is reached through the small Backend
// interface (backend.go), which the serve command implements over engine and tokenizer. It
// imports only the standard library.
//
// # Endpoints
//
//	POST /v1/chat/completions   chat, streaming (SSE) or not; tools; reasoning
//	POST /v1/completions        plain text completion, streaming or not
//	POST /v1/responses          OpenAI Responses: input items, tools, reasoning items,
//	                            stored responses (GET and DELETE /v1/responses/{id});
//	                            POST /v1/responses/input_tokens counts a request's prompt
//	POST /v1/messages           Anthropic Messages; POST /v1/messages/count_tokens
//	GET  /v1/models             the served model; GET /v1/models/{id} for one
//	GET  /health                {"status":"ok", ...}; never needs the API key
//	GET  /metrics               Prometheus text format (see Metrics)
//
// /chat/completions, /completions, /responses and /models answer too, for clients whose
// base URL has no /v1. Unknown paths get 404 and wrong methods 405, as OpenAI error JSON, or
// in Anthropic's shape under /v1/messages.
//
// # One generation path
//
// Responses and Messages requests are translated into the chat request that chat
// completions decodes (handle_responses.go, handle_messages.go): the same messages, tools
// and tool choice, rendered by the same chat template, run through the same queue, prefix
// cache and cancellation, parsed by the same think splitter and tool-call parser. Only the
// answer writers differ: each turns the parser's events (text, reasoning, a complete tool
// call) into its API's objects and events. So one conversation gets one greedy answer
// through all three APIs. Metrics carry the endpoint.
//
// Responses are kept, when the request stores them (the default), in a bounded in-memory
// store (Config.ResponseStoreBytes, least recently used out first) that serves GET,
// previous_response_id and item_reference; instructions do not carry over to a chained
// request. Both agent APIs fold system turns into one at the start (foldSystemTurns), as
// agents send them where Qwen3.5's template refuses them. On both, an explicit max tokens
// is a cap shortened to the context (agents send one large value whatever the model),
// while chat completions refuses what does not fit. Their streams name every event, never end without a terminal event
// (response.failed, or an Anthropic error event, after a failure), and send keep-alives
// while quiet (Config.StreamKeepAlive). The Messages API reports the stop sequence that
// matched; the server applies those itself to know which one it was.
//
// # Policies
//
// Concurrency: the engine decodes a batch of requests in each step, so up to its batch size
// (ConcurrentBackend.MaxConcurrent; one for a Backend without it) generations run at once.
// Others wait in a FIFO queue of Config.MaxQueue places; one more gets 429 with Retry-After,
// estimated from the waiting and running requests shared over the slots.
// A client that disconnects, while queued or mid-answer, cancels its generation (the
// Backend sees its context end); one that only half-closes its sending side after the
// request is answered in full (a 102 Processing response or an SSE comment tells the two
// apart, see clientWatch). On shutdown the server stops accepting, lets running and
// queued work finish for Config.DrainTimeout, then cancels the rest (503 / an in-stream
// error) and returns nil.
//
// Stop strings are passed to the backend, which must end generation at them and never emit
// them. The server checks the text again and cuts at the first stop string itself, holding
// back a possible partial match between deltas, so a stop string never reaches a client
// even if a backend emits it; finish_reason is then "stop".
//
// Context: the prompt must leave at least one token free. An explicit max_tokens (or
// max_completion_tokens, which wins) must fit in the rest of the context and under
// Config.MaxTokensLimit, or the request gets a 400 naming the field; without one the answer
// gets Config.DefaultMaxTokens, shortened to fit, and ends with "length" when it runs out.
// Text too long to fit even at the most bytes a token can cover (TokenBounder) is refused
// with the same context_length_exceeded before it is tokenized.
//
// Tool calls: with tools given and tool_choice not "none", each <tool_call>...</tool_call>
// block in the output becomes a tool call (id "call_<random>", arguments as a JSON string),
// sent in a stream as one event when its block closes; the answer then ends with
// finish_reason "tool_calls". The block is read in the format of the model's chat template
// (ToolCallFormatter): Qwen3's JSON {"name": ..., "arguments": {...}}, or the qwen3_coder
// XML of Qwen3.5 and later, <function=NAME> with <parameter=P>value</parameter> elements,
// whose values become JSON by the tool schema's types. A block that does not parse stays in
// the content. tool_choice "required" and a named function are enforced by starting the
// answer with "<tool_call>\n" (and the name, in the format's form), through
// TemplateOptions.ResponsePrefix. parallel_tool_calls false keeps the first call only.
//
// Reasoning: <think>...</think> at the start of a chat answer (or from the start, when the
// template opened the block, Prompt.OpensInThinking) is sent as reasoning_content, not as
// content, in streams and in full answers. chat_template_kwargs.enable_thinking reaches the
// template. Text completions are sent raw.
//
// Every answer carries usage and a "dflash" object (tau, cycles, drafted, accepted,
// acceptance_rate, batch_size, prefill_ms, decode_ms, draft_ms and verify_ms when the
// backend measured them, queue_ms, cached_prompt_tokens, tokens_per_second): chat
// completions and completions in the answer, their streams on the final chunk (and on the
// usage chunk), Responses on the response object (in a stream, response.completed's or
// response.incomplete's), Messages on the message (in a stream, message_delta). The
// numbers are this request's own, however many requests the engine batched with it: drafted
// and accepted count the draft tokens proposed and accepted for it (0 for plain decoding),
// acceptance_rate is accepted/drafted and absent when nothing was drafted, batch_size is the
// mean number of sequences that shared its forward passes and absent when the backend does
// not report it. tokens_per_second is the completion tokens after the first over decode_ms
// (the first comes out of the prefill), and null when there is no interval to time: fewer
// than two tokens, or decode_ms under 1.
// stream_options.include_usage adds the usage chunk with empty choices before [DONE].
//
// Requests are validated strictly: a wrong type or value is a 400 whose message and param
// name the field ("messages[1].content[0].type"); a body over Config.MaxBodyBytes is a 413;
// a wrong API key a 401 (the key may come as a Bearer token or as x-api-key); an unknown
// model a 404. n other than 1, logprobs, echo and suffix are refused with 400 because the
// server cannot honour them; presence/frequency penalties, logit_bias, user, metadata,
// store and unknown fields are accepted and ignored. A panic in a handler becomes a 500
// JSON error.
//
// # Structured outputs
//
// response_format (chat and text completions), text.format (Responses) and
// output_config.format (Messages) of type json_object or json_schema make the answer JSON,
// any object or one valid for the schema, enforced token by token by a backend that
// implements ConstraintBackend (structured.go); a forced tool_choice ("required", a named
// function; Anthropic's any and tool) makes the answer calls of the tools in the model's
// own format with arguments valid for their schemas. The grammars come from package
// structured; a schema it cannot enforce, or one the backend refuses, is a 400 naming the
// field before generation. A backend without ConstraintBackend refuses the JSON formats
// (400) and starts a forced call with an answer prefix only.
//
// # Metrics
//
// /metrics counts HTTP requests by endpoint and status code (dflash_http_requests_total)
// and generations by endpoint and outcome (dflash_generations_total); sums prompt and
// completion tokens, and the draft tokens proposed and accepted by endpoint
// (dflash_draft_tokens_total, dflash_accepted_draft_tokens_total: their ratio is the
// acceptance over all requests); and keeps per-request histograms of τ (dflash_tau), the
// acceptance rate of the requests that drafted (dflash_acceptance_rate), decode speed, queue
// wait, queue depth on arrival and request duration, plus the queue's, the response store's,
// the prefix cache's and the device memory's gauges and the rows of each decode step
// (dflash_batch_rows).
//
// Each request is logged in one line: id, status, prompt and completion tokens, τ, tok/s,
// finish reason, queue time.
//
// # Example
//
//	srv, err := server.New(server.Config{Port: 8000, MaxQueue: 16}, backend, slog.Default())
//	if err != nil {
//		return err
//	}
//	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
//	defer stop()
//	return srv.ListenAndServe(ctx) // returns nil after a drain on SIGTERM
//
// Package servertest holds a scripted fake Backend and a loopback test server; sdktest
// drives a server with the official openai and anthropic SDKs for Python and Node and with
// the Vercel AI SDK; templatetest runs tool calls through real chat templates.
package server
