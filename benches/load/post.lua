-- wrk script: POSTs of 1 KiB JSON bodies, each with an Idempotency-Key.
--
--   wrk ... -s post.lua URL -- MODE PREFIX N
--
-- MODE unique : request i of thread t has key PREFIX-t-i: every request is first-seen (as
--               long as PREFIX is new to the store).
-- MODE replay : request i uses index (i * 7919) mod N: key PREFIX-<idx>. A store
--               that already holds PREFIX-0 .. PREFIX-(N-1) answers each from the store; the
--               stride spreads the reads over all N keys.
-- MODE fill   : request i < N has key PREFIX-i (first-seen); the thread stops
--               after N responses (requests sent past N replay key 0). One thread only.
-- MODE get    : a GET without a body (pass-through rows bg, cg).
-- The body is a function of the key alone, so a fill's keys replay cleanly (the same key
-- with another body would be a 422).
-- done() prints one machine-readable RESULT line that run.sh parses.

local mode, prefix, n = "unique", "k", 0
local counter, responses = 0, 0
local pad = string.rep("x", 1024)
local path = "/"
local headers = { ["Content-Type"] = "application/json" }
local threads = {}

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

-- The body names its key, so bodies differ between runs with other prefixes (a fingerprint
-- route keys on the body), and is padded to exactly 1024 bytes.
local function body(key)
  local head = '{"ref":"' .. key .. '","sku":"A-1","qty":1,"currency":"EUR","note":"'
  return head .. pad:sub(1, 1024 - 2 - #head) .. '"}'
end

function request()
  local key, b
  if mode == "get" then
    return wrk.format("GET", path)
  end
  if mode == "unique" then
    key = string.format("%s-%d-%d", prefix, tid or 0, counter)
    b = body(key)
  elseif mode == "replay" then
    local idx = (counter * 7919) % n
    key = string.format("%s-%d", prefix, idx)
    b = body(key)
  else -- fill
    local idx = counter < n and counter or 0
    key = string.format("%s-%d", prefix, idx)
    b = body(key)
  end
  counter = counter + 1
  headers["Idempotency-Key"] = key
  return wrk.format("POST", path, headers, b)
end

-- Defining response() makes wrk parse every response (load-generator CPU), so only the
-- fill mode installs it.
local function count_response(status, hdrs, b)
  responses = responses + 1
  if responses >= n then
    wrk.thread:stop()
  end
end

function init(args)
  mode = args[1] or "unique"
  prefix = args[2] or "k"
  n = tonumber(args[3] or "0")
  path = wrk.path
  if mode == "fill" then
    response = count_response
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d connect=%d read=%d write=%d status=%d timeout=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
