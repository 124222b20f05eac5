// Package openai is the OpenAI wire format of the deployment API (chat
// completions, the Responses API, embeddings, legacy completions): it
// decodes and validates requests into llm's requests, and encodes
// responses, server-sent events and errors. It is pure functions; the
// deployment API (deployapi) owns the HTTP server.
//
// Encoders append to a caller's []byte and never use reflection, so the
// per-token path (ChunkEncoder.AppendContent) does not allocate.
//
// # Request mapping
//
// DecodeChatRequest is strict: an explicit null is the same as an absent
// field, and a field that is absent stays nil in runtime.Options so the
// model's own defaults apply. Every 400 names the offending parameter in
// OpenAI's path syntax (messages[1].content[0].type).
//
// Every field of the current OpenAI API on these routes is known (a test
// walks the official Go SDK's request types, at every depth, and fails on
// a field the decoders do not list). A field is honoured where the
// deployment can honour it; otherwise it is accepted and ignored when
// ignoring it cannot hand the client something else than it asked for (a
// hint, an identifier, a tier, a caching option: each row says why it
// changes nothing), and refused with a 400 naming it and saying why when
// it would (store true, audio, moderation, built-in tools, …). Only a
// field the API does not have is a 400 unknown_parameter.
//
//	OpenAI field               runtime field / outcome
//	------------               -----------------------
//	(body not JSON)            400, message gives the byte offset
//	(body not an object)       400
//	(unknown field X)          400 "Unrecognized request argument supplied: X", param X;
//	                           unknown keys inside messages, parts, tools and
//	                           response_format are refused the same way
//	model                      required string; ≠ the deployment's model → 404 model_not_found
//	messages                   Messages; required, non-empty array
//	  .role                    system, user, assistant, tool; developer → system; other → 400
//	  .content                 Content; string, or array of parts whose "text"
//	                           (and, for assistant, "refusal") parts are concatenated
//	                           without separator; image_url, input_audio, file → 400
//	                           (text-only model). Required except for assistant. A text
//	                           part's prompt_cache_breakpoint (an object) is accepted and
//	                           ignored: the runtime caches the prompt's prefix by itself
//	  .name                    accepted, dropped (the runtime has no participant names)
//	  .tool_calls (assistant)  ToolCalls; type "function" (custom → 400); arguments, a JSON
//	                           string, must hold a JSON object ("" counts as {}) → Arguments raw
//	  .refusal (assistant)     used as Content when content is empty
//	  .audio, .function_call   400
//	  .tool_call_id (tool)     required; ToolName = name of the earlier assistant tool
//	                           call with that id ("" when none matches: history may be trimmed)
//	temperature                Options.Temperature, 0..2
//	top_p                      Options.TopP, 0..1
//	presence_penalty           Options.PresencePenalty, -2..2
//	frequency_penalty          Options.FrequencyPenalty, -2..2
//	seed                       Options.Seed, integer
//	top_k                      Options.TopK, -1..2^20 (vLLM's; -1 and 0 turn it off)
//	min_p                      Options.MinP, 0..1 (vLLM's)
//	repetition_penalty         Options.RepetitionPenalty, 0..10 (vLLM's; 1 is none)
//	max_completion_tokens      Options.MaxTokens, integer ≥ 1
//	max_tokens                 Options.MaxTokens, integer ≥ 1; when both are sent they
//	                           must be equal, else 400 on max_tokens (preferring one would
//	                           hide a client bug that changes the output length)
//	stop                       Options.Stop; string or array of ≤ 4 strings; empty
//	                           strings are dropped (they would stop at once)
//	response_format            {"type":"text"} → nothing; json_object → Format "json";
//	                           json_schema → Format = json_schema.schema (required object
//	                           the runtime can take, CheckSchema: else 400
//	                           invalid_json_schema naming response_format);
//	                           json_schema.strict either way (decoding is constrained)
//	tools                      Tools; ≤ 128, type "function" only (custom tools, which take
//	                           free text → 400 naming the type), unique names matching
//	                           ^[a-zA-Z0-9_-]{1,64}$, parameters an object (absent → empty
//	                           object schema). function.strict is accepted either way; a
//	                           forced call's arguments are constrained to the schema
//	tool_choice                "auto" → nothing; "none" → Tools dropped; "required" →
//	                           ForceTool = llm.ToolAny (400 without tools); {"type":"function",
//	                           "function":{"name":N}} → ForceTool = N (400 naming tool_choice
//	                           when N is not among tools); {"type":"allowed_tools",
//	                           "allowed_tools":{"mode","tools"}} → Tools keeps the listed
//	                           functions (each one of tools), mode "required" → ForceTool
//	                           ToolAny; custom → 400. The deployment API forces the call by
//	                           constraining the output to a JSON schema (deployapi/generate.go)
//	parallel_tool_calls        true → nothing; false → MaxToolCalls 1: later calls are dropped
//	stream                     ChatRequest.Stream
//	stream_options             only with stream true, else 400; include_usage →
//	                           ChatRequest.IncludeUsage; include_obfuscation true → 400
//	n                          ChatRequest.N, 1…MaxChoices (8): n independent generations,
//	                           choices indexed 0…n−1; above 8 → 400 naming n
//	user, safety_identifier,   strings, accepted and dropped: an end-user identifier is
//	prompt_cache_key,          recorded nowhere (the key's usage is what is counted), and
//	prompt_cache_retention     the runtime keeps its prompt cache by itself, so caching hints
//	                           change nothing in the output
//	prompt_cache_options       an object, accepted and dropped (caching, as above)
//	logit_bias                 {} → nothing; non-empty → 400
//	logprobs                   Options.Logprobs (400 where the runtime cannot give them)
//	top_logprobs               0–20 → Options.TopLogprobs; needs logprobs true
//	reasoning_effort           "none", "minimal" (= "low"), "low", "medium", "high", "xhigh"
//	                           and "max" (= "high", the most a runtime offers) →
//	                           Options.Think; the thinking comes back as reasoning_content
//	                           (message and deltas) and usage.completion_tokens_details
//	                           .reasoning_tokens; 400 where the model cannot reason
//	chat_template_kwargs       an object (vLLM's arguments to the chat template). The runtime
//	                           renders the template itself and takes none; the thinking
//	                           switches the templates have are honoured: enable_thinking
//	                           and thinking (booleans) → Options.Think medium or none,
//	                           reasoning_effort → as above, unless reasoning_effort is sent;
//	                           any other key is accepted and has no effect
//	verbosity                  "medium" → nothing; "low", "high" → an instruction to answer
//	                           briefly or thoroughly, added to the opening system message (or
//	                           as one): the runtime has no length setting short of max_tokens,
//	                           which cuts an answer rather than making it brief
//	store                      false → nothing; true → 400
//	metadata                   {} → nothing; non-empty → 400 (only kept with store)
//	service_tier               "auto", "default" → nothing (a dedicated server has one
//	                           tier); other tiers (flex, priority, …) → 400: the answer would
//	                           not be what they promise
//	modalities                 ["text"] (or []) → nothing; "audio" → 400
//	audio, prediction,         any value → 400
//	web_search_options
//	moderation                 any value → 400: there is no moderation model, and an answer
//	                           taken for a moderated one would mislead
//	functions, function_call   (deprecated) any value → 400, use tools / tool_choice
//
// # Responses API
//
// DecodeResponsesRequest decodes POST /responses the same strict way, into
// the same llm.Request; ResponseEncoder encodes the answer: a response
// object, or (stream true) the typed events response.created,
// response.in_progress, per output item response.output_item.added …
// .done around response.content_part.added/.done and the
// response.output_text.delta (response.reasoning_text.delta,
// response.function_call_arguments.delta/.done) events, then
// response.completed, response.incomplete or response.failed, each
// "event: <type>" plus "data: <json>" with sequence_number counting from 0
// and no [DONE]. Nothing is stored: a request carries the whole
// conversation. The response repeats the request's settings (instructions,
// max_output_tokens, temperature, top_p, tools, tool_choice,
// parallel_tool_calls, text, reasoning, metadata, store false, …).
//
//	Responses field            runtime field / outcome
//	---------------            -----------------------
//	(unknown field X)          400 naming X, also inside input items, parts, tools, text, reasoning
//	model                      required string; ≠ the deployment's model → 404 model_not_found
//	input                      Messages; a string (one user message) or a non-empty array of items:
//	                           message (type optional; role user, system, assistant, developer →
//	                           system; content a string or input_text/output_text parts, refusal
//	                           for assistant; input_image, input_file, input_audio → 400),
//	                           function_call (call_id, name, arguments → ToolCalls of an
//	                           assistant message), function_call_output (call_id, output →
//	                           a tool message; a call_id of no function_call before it → 400
//	                           naming input, as OpenAI), reasoning (below); item_reference
//	                           and built-in tools' items → 400. A function call's and
//	                           output's namespace, caller and async (for tools this
//	                           deployment does not have) are accepted and ignored, so is an
//	                           input_text part's prompt_cache_breakpoint, and an output_text
//	                           part's annotations and logprobs sent back
//	  reasoning item           an earlier answer's thinking, given back to the model as the
//	                           thinking (Message.Thinking) of the assistant message or calls
//	                           after it: encrypted_content, which this node sealed (include
//	                           below), opened with its key, else content's reasoning_text
//	                           parts; one the key does not open (another node's, tampered,
//	                           or sealed before the node was wiped) → 400
//	                           invalid_encrypted_content naming it. summary, id, status are
//	                           accepted and ignored
//	instructions               a system message before the input
//	temperature                Options.Temperature, 0..2
//	top_p                      Options.TopP, 0..1
//	max_output_tokens          Options.MaxTokens, integer ≥ 1; a response cut by it is
//	                           status incomplete, incomplete_details.reason max_output_tokens
//	text                       .format {"type":"text"} → nothing; json_object → Format "json";
//	                           json_schema (name, schema required; description, strict) →
//	                           Format = schema (CheckSchema, naming text.format);
//	                           .verbosity as chat's verbosity, echoed
//	reasoning                  .effort as chat's reasoning_effort → Options.Think; thinking
//	                           comes back as a reasoning item (reasoning_text content);
//	                           .summary, .generate_summary "auto", "concise", "detailed" →
//	                           echoed, nothing else: no summary is made, the thinking itself
//	                           comes back; .context "current_turn" (and "auto") → the
//	                           reasoning items of the input before its last user message are
//	                           not shown to the model, "all_turns" → all are; .mode
//	                           "standard" → nothing, other modes → 400
//	tools                      Tools; ≤ 128 {"type":"function",name,description,parameters,strict};
//	                           defer_loading, allowed_callers, async and output_schema are
//	                           accepted and ignored (no tool search, programmatic calling or
//	                           asynchronous calls: every tool is offered, and called directly);
//	                           web_search, file_search, code_interpreter, mcp, custom, namespace,
//	                           … → 400 naming the type
//	tool_choice                "auto" → nothing; "none" → Tools dropped; "required" → ForceTool
//	                           ToolAny; {"type":"function","name"} → ForceTool name (a tool of
//	                           tools); {"type":"allowed_tools","mode","tools"} as chat's, echoed;
//	                           built-in tools' types → 400
//	parallel_tool_calls        false → MaxToolCalls 1
//	max_tool_calls             integer ≥ 0 → MaxToolCalls: at most that many function calls
//	                           come back, later ones are dropped (OpenAI counts built-in
//	                           tools' calls, which this deployment has none of); 0 → no tools
//	                           offered (400 with a tool_choice that requires a call)
//	stream                     the typed server-sent events above
//	stream_options             only with stream true; include_obfuscation true → 400
//	metadata                   ≤ 16 string pairs (keys ≤ 64, values ≤ 512 bytes), echoed back
//	user, safety_identifier,   strings, accepted, echoed back, ignored (as chat's)
//	prompt_cache_key,
//	prompt_cache_retention
//	prompt_cache_options,      objects, accepted and ignored: caching as chat's, and no
//	access_programs            access program gates anything on a dedicated deployment
//	context_management         an array of {type, compact_threshold}, accepted and ignored:
//	                           nothing is compacted server-side; truncation "auto" fits a long
//	                           conversation to the context
//	moderation                 any value → 400, as chat's
//	service_tier               "auto", "default" → nothing; other tiers → 400
//	truncation                 "disabled" → nothing (an input longer than the context is a
//	                           400); "auto" → Truncate: the oldest input items are dropped
//	                           until the input, estimated at 4 bytes a token, leaves room in
//	                           the context for max_output_tokens — never the instructions or
//	                           system items, nor the last item, and a call with its outputs
//	top_logprobs               0–20 → Options.TopLogprobs with include's logprobs, else nothing
//	include                    "reasoning.encrypted_content" → each reasoning item carries its
//	                           thinking sealed (AES-256-GCM under a key of the node's, kept in
//	                           its state, replaced when the node is wiped) in encrypted_content,
//	                           which a later request may send back in input (OpenAI's
//	                           stateless reasoning); "message.output_text.logprobs" →
//	                           Options.Logprobs: each output_text part and delta carries its
//	                           tokens' logprobs (400 naming include where the runtime cannot
//	                           give them); the other values name outputs of built-in tools and
//	                           image inputs this deployment never has: nothing to add; any
//	                           other value → 400
//	store                      false → nothing; true → 400 (responses are not kept)
//	background                 false → nothing; true → 400
//	background_options,        objects, accepted and ignored: no background execution (as
//	image                      background true is a 400), no image input to compress
//	previous_response_id,      any value → 400: nothing is stored; send the whole
//	conversation, prompt       conversation as input
//
// # Embeddings
//
// DecodeEmbeddingsRequest (POST /embeddings) follows the same rules; its
// answer is {"object":"list","data":[{"object":"embedding","index","embedding"}],
// "model","usage":{"prompt_tokens","total_tokens"}} (AppendEmbeddings). A
// batch is one request to admission, whatever its size.
//
//	embeddings field           runtime field / outcome
//	----------------           -----------------------
//	model                      required string; ≠ the deployment's model → 404 model_not_found;
//	                           a model the runtime cannot embed with → 400 naming model
//	input                      EmbedRequest.Input; a non-empty string, or an array of 1–2048
//	                           non-empty strings (the whole body under the body limit);
//	                           "" or [] → 400; token arrays (integers) → 400: the runtime
//	                           embeds text only; an input longer than the context → 400
//	                           (not truncated)
//	encoding_format            "float" (default) → numbers; "base64" → the little-endian
//	                           float32 values, base64-encoded, as OpenAI sends them
//	dimensions                 EmbedRequest.Dimensions, 1–65536; honoured where the runtime
//	                           shortens vectors (Ollama 0.17.4 truncates and renormalises),
//	                           else 400 naming dimensions (0.9.6, or more than the model has)
//	user                       string, accepted and dropped
//
// # Legacy completions
//
// DecodeCompletionRequest (POST /completions) continues each prompt as it is:
// the runtime gets it raw, without the chat template, unless a suffix asks
// the model to fill in the middle. Its answer is a text_completion
// (AppendTextCompletion; TextChunkEncoder for streams: one chunk per piece
// of text, a chunk with the finish reason, the usage chunk with
// include_usage, then data: [DONE]).
//
//	completions field          runtime field / outcome
//	-----------------          -----------------------
//	model                      required string; ≠ the deployment's model → 404 model_not_found
//	prompt                     CompletionRequest.Prompt; a required non-empty string, or an
//	                           array of 1–8 of them, each continued n times (choice i is
//	                           prompt i/n, as OpenAI orders them); token arrays → 400
//	suffix                     CompletionRequest.Suffix: fill in the middle through the
//	                           model's template; 400 where the model lacks the "insert"
//	                           capability
//	max_tokens                 Options.MaxTokens, integer ≥ 1; absent → 16, as OpenAI's
//	                           (deployapi applies it, within the output cap)
//	temperature, top_p,        as in chat
//	presence_penalty,
//	frequency_penalty, seed,
//	top_k, min_p,
//	repetition_penalty, stop
//	stream, stream_options     as in chat (include_usage)
//	user                       string, accepted and dropped
//	n                          completions per prompt, 1…MaxChoices; prompts × n ≤ MaxChoices
//	                           (8), each a generation of its own with its own slot, choice
//	                           i%n sampling with seed+i%n; above → 400 naming n
//	best_of                    1 → nothing; anything else → 400
//	echo                       false → nothing; true → 400
//	logprobs                   any integer → 400 (not given for legacy completions)
//	logit_bias                 {} → nothing; non-empty → 400
//
// # Errors
//
// Errors have OpenAI's shape {"error":{"message","type","param","code"}}:
// 400/404/405/413/401 use type invalid_request_error, 429 uses type
// requests with code rate_limit_exceeded, and 500/503/504 use type
// server_error. RuntimeError maps runtime errors to these.
package openai
