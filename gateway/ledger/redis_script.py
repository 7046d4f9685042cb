"""The Lua script that applies ledger batches inside Redis: one round trip per flush, atomic per call,
idempotent by the (source, seq, ts) marker of each batch. The marker is checked first and set last, and
every operation is idempotent, so a script cut short by an error (READONLY after a failover, OOM under
`maxmemory`) changes nothing that a retry of the same batch would not redo the same way.

Redis layout under the prefix P:
  P..applied:<source>:<seq>:<ts>  marker, expires after a day
  P..rec       HASH id -> msgpack [source, medium, hash, parent, tenant, epoch, stored_at, removed_at,
               closed_by, policy_version, copies, unknown_since]  (epoch -1 = none, removed_at -1 = resident,
               unknown_since -1 = known; records written before copies/unknown_since have 10 fields)
  P..open:<source>  HASH medium \\x1f hash -> id   (resident records of a source)
  P..ids       counter for record ids
  P..cursors   HASH source -> msgpack [seq, ts]
  P..events    HASH source \\x1f kind \\x1f boundary -> msgpack [source, kind, boundary, learned_at, closed]
  P..tally     HASH tenant \x1f medium \x1f epoch -> msgpack [stored, removed, open, unknown, has_last,
               last_removed_at, has_longest, max_lifetime]    (the audit's per-epoch totals)
  P..closes    HASH tenant \x1f medium \x1f epoch \x1f closed_by -> count
  P..life:<tenant>\x1f<medium>  HASH ceil(lifetime s) -> count   (closed records' lifetimes, 1-second buckets)
  P..lifehigh:<tenant>\x1f<medium>  ZSET ceil(lifetime s) scored by the longest lifetime in that bucket
  P..lifegroups:<tenant>\x1f<medium>  HASH floor(ceil(lifetime s) / 256) -> count
  P..openby    HASH source \x1f tenant \x1f medium -> open records
  P..age:<source>\x1f<tenant>\x1f<medium>  ZSET id by stored_at   (open records, for ages past retention)
  P..closed    ZSET id by removed_at   (closed records still kept one by one; compaction deletes the oldest)
  P..aggkeys   SET of the life:/age: keys above (so a rebuild can delete them without KEYS)
  P..aggregates  "1" once the totals above describe every record (set by BACKFILL_LUA)
  P..compacted_before  closed records removed before this time are only in the totals
  P..writes    counter of apply calls and of compaction calls that deleted records (a paged read of P..rec
               compares it before and after, to say whether it read the records as of one instant)
  P..changing  HASH source \x1f <seq>:<ts> -> kind   (an op over a whole source that a call left part done: the
               audit says so, since its source event is recorded only when its last record is)
Batches arrive as msgpack [[source, seq, ts_text, policy_version, ops, first, last], ...]: a batch larger than one
call's budget comes in slices (`first`: the index of its first op; `last`: 1 on the final slice), and
P..progress:<source>:<seq>:<ts> holds how far the batch got (ops done; for an op over a whole source, its
HSCAN cursor), so the next call, a retry or another replica resumes where it stands; the marker is set only
with its last op. ARGV[4] is the call's budget (ops plus records scanned): the script stops when it is spent
and says which part to send again. Ops are
  [1, medium, hash, parent, tenant, epoch, stored_at]   open
  [2, medium, hash, removed_at]                          close
  [3, media_csv, stored_before, at, reason]              clear ("" = every medium, -1 = no time bound)
  [4, medium, hash, copies]                              copy count of an open record
  [5, since]                                             silence: open records become unknown
  [6, at]                                                resume: unknown records are resident again
msgpack arrays with nil break Lua tables, hence the -1 and "" stand-ins.
"""

TALLY_LUA = r"""
local SEP = "\31"
local REC = prefix .. "rec"

-- What one call changed in the audit's totals, written once at its end (`write_tallies`), as the SQLite
-- store's TallyDelta does: per call the work is one update per distinct key, not one per record.
local tally, closes, lifetimes, openby, age_keys = {}, {}, {}, {}, {}

-- Key strings are built once per call and looked up through nested tables afterwards (a Lua concatenation
-- allocates and hashes a new string; a table lookup of strings already interned does not).
local joined_memo, close_memo, age_memo, pair_memo = {}, {}, {}, {}
local function joined(a, b, c)
  local level = joined_memo[a]
  if not level then
    level = {}
    joined_memo[a] = level
  end
  local leaf = level[b]
  if not leaf then
    leaf = {}
    level[b] = leaf
  end
  local key = leaf[c]
  if not key then
    key = a .. SEP .. b .. SEP .. tostring(c)
    leaf[c] = key
  end
  return key
end

local function tally_row(tenant, medium, epoch)
  local key = joined(tenant, medium, epoch)
  local row = tally[key]
  if not row then
    row = {0, 0, 0, 0, false, false}
    tally[key] = row
  end
  return row, key
end

local function add_open_by(key, change)
  openby[key] = (openby[key] or 0) + change
end

local function age_key(group)
  local key = age_memo[group]
  if not key then
    key = prefix .. "age:" .. group
    age_memo[group] = key
  end
  return key
end

local function tally_opened(id, source, tenant, medium, epoch, stored_at)
  local row = tally_row(tenant, medium, epoch)
  row[1] = row[1] + 1
  row[3] = row[3] + 1
  local group = joined(source, tenant, medium)
  add_open_by(group, 1)
  local key = age_key(group)
  redis.call("ZADD", key, stored_at, id)
  age_keys[key] = true
end

-- rec: the record before its close (its removed_at still -1)
local function tally_closed(id, rec, at, reason)
  local source, medium, tenant, epoch, stored_at = rec[1], rec[2], rec[5], rec[6], rec[7]
  local row, row_key = tally_row(tenant, medium, epoch)
  local lifetime = at - stored_at
  row[2] = row[2] + 1
  row[3] = row[3] - 1
  if (rec[12] or -1) >= 0 then row[4] = row[4] - 1 end
  if row[5] == false or at > row[5] then row[5] = at end
  if row[6] == false or lifetime > row[6] then row[6] = lifetime end
  local by_reason = close_memo[row_key]
  if not by_reason then
    by_reason = {}
    close_memo[row_key] = by_reason
  end
  local close_key = by_reason[reason]
  if not close_key then
    close_key = row_key .. SEP .. reason
    by_reason[reason] = close_key
  end
  closes[close_key] = (closes[close_key] or 0) + 1
  local by_medium = pair_memo[tenant]
  if not by_medium then
    by_medium = {}
    pair_memo[tenant] = by_medium
  end
  local pair = by_medium[medium]
  if not pair then
    pair = tenant .. SEP .. medium
    by_medium[medium] = pair
  end
  local buckets = lifetimes[pair]
  if not buckets then
    buckets = {}
    lifetimes[pair] = buckets
  end
  local bucket = math.max(0, math.ceil(lifetime))
  local seen = buckets[bucket]
  if not seen then
    buckets[bucket] = {1, lifetime}
  else
    seen[1] = seen[1] + 1
    if lifetime > seen[2] then seen[2] = lifetime end
  end
  local group = joined(source, tenant, medium)
  add_open_by(group, -1)
  redis.call("ZREM", age_key(group), id)
  redis.call("ZADD", prefix .. "closed", at, id)
end

local function tally_unknown(rec, change)
  local row = tally_row(rec[5], rec[2], rec[6])
  row[4] = row[4] + change
end

-- A histogram bucket: its count (HINCRBY) in P..life:<pair>, its longest lifetime as its score in the sorted
-- set P..lifehigh:<pair> (ZADD GT: one call, raised only when it grows). The 1-second buckets' counts are also
-- summed per GROUP_S seconds, so a rank or a count past retention reads the groups and one group's seconds.
local GROUP_S = 256
local function add_to_histogram(pair, bucket, delta)
  local field = tostring(bucket)
  redis.call("HINCRBY", prefix .. "life:" .. pair, field, delta[1])
  redis.call("ZADD", prefix .. "lifehigh:" .. pair, "GT", delta[2], field)
end

local function write_tallies()
  local key_tally = prefix .. "tally"
  for key, delta in pairs(tally) do
    local packed = redis.call("HGET", key_tally, key)
    local row = packed and cmsgpack.unpack(packed) or {0, 0, 0, 0, 0, 0, 0, 0}
    for i = 1, 4 do row[i] = row[i] + delta[i] end
    if delta[5] ~= false and (row[5] == 0 or delta[5] > row[6]) then row[5], row[6] = 1, delta[5] end
    if delta[6] ~= false and (row[7] == 0 or delta[6] > row[8]) then row[7], row[8] = 1, delta[6] end
    redis.call("HSET", key_tally, key, cmsgpack.pack(row))
  end
  for key, count in pairs(closes) do
    redis.call("HINCRBY", prefix .. "closes", key, count)
  end
  for key, change in pairs(openby) do
    if change ~= 0 then redis.call("HINCRBY", prefix .. "openby", key, change) end
  end
  for key in pairs(age_keys) do
    redis.call("SADD", prefix .. "aggkeys", key)
  end
  for pair, buckets in pairs(lifetimes) do
    local groups_key = prefix .. "lifegroups:" .. pair
    redis.call("SADD", prefix .. "aggkeys", prefix .. "life:" .. pair, prefix .. "lifehigh:" .. pair, groups_key)
    local groups = {}
    for bucket, delta in pairs(buckets) do
      add_to_histogram(pair, bucket, delta)
      local group = math.floor(bucket / GROUP_S)
      groups[group] = (groups[group] or 0) + delta[1]
    end
    for group, count in pairs(groups) do redis.call("HINCRBY", groups_key, tostring(group), count) end
  end
end
"""

APPLY_LUA = r"""
local prefix = ARGV[1]
local ttl = tonumber(ARGV[2])
local batches = cmsgpack.unpack(ARGV[3])
""" + TALLY_LUA + r"""
local function unpacked(id)
  local packed = redis.call("HGET", REC, id)
  if not packed then return nil end
  local rec = cmsgpack.unpack(packed)
  if rec[11] == nil then rec[11] = 1 end
  if rec[12] == nil then rec[12] = -1 end
  return rec
end

local function close_record(id, at, reason)
  local rec = unpacked(id)
  if not rec or rec[8] ~= -1 then return end
  tally_closed(id, rec, at, reason)
  rec[8] = at
  rec[9] = reason
  redis.call("HSET", REC, id, cmsgpack.pack(rec))
end

local function add_event(source, kind, boundary, at, count)
  local key = source .. SEP .. kind .. SEP .. boundary
  redis.call("HSETNX", prefix .. "events", key, cmsgpack.pack({source, kind, tonumber(boundary), at, count}))
end

local function open_block(source, version, op)
  local openkey = prefix .. "open:" .. source
  local field = op[2] .. SEP .. op[3]
  if redis.call("HEXISTS", openkey, field) == 1 then return end
  local id = tostring(redis.call("INCR", prefix .. "ids"))
  redis.call("HSET", REC, id, cmsgpack.pack({source, op[2], op[3], op[4], op[5], op[6], op[7], -1, "",
                                              version, 1, -1}))
  redis.call("HSET", openkey, field, id)
  tally_opened(id, source, op[5], op[2], op[6], op[7])
end

local function close_block(source, op)
  local openkey = prefix .. "open:" .. source
  local field = op[2] .. SEP .. op[3]
  local id = redis.call("HGET", openkey, field)
  if not id then return end
  close_record(id, op[4], "removed")
  redis.call("HDEL", openkey, field)
end

local function set_copies(source, op)
  local id = redis.call("HGET", prefix .. "open:" .. source, op[2] .. SEP .. op[3])
  if not id then return end
  local rec = unpacked(id)
  if rec then
    rec[11] = op[4]
    redis.call("HSET", REC, id, cmsgpack.pack(rec))
  end
end

-- Ops that touch every open record of a source (silence, resume, clear) go through its open set in HSCAN pages
-- of about the call's remaining budget; an op not finished when the budget is spent carries on in the next
-- call from its saved cursor. A field HSCAN returns twice is skipped by the checks (still open? still known?).
local budget = tonumber(ARGV[4])

local function scan_page(openkey, cursor)
  local page = redis.call("HSCAN", openkey, cursor, "COUNT", math.max(100, budget))
  budget = budget - #page[2] / 2 - 1
  return page[1], page[2]
end

local function mark_unknown(source, boundary, op, value, cursor, count)
  local next_cursor, pairs_ = scan_page(prefix .. "open:" .. source, cursor)
  for i = 1, #pairs_, 2 do
    local id = pairs_[i + 1]
    local rec = unpacked(id)
    if rec and rec[8] == -1 and (value < 0) ~= (rec[12] < 0) then
      tally_unknown(rec, value < 0 and -1 or 1)
      rec[12] = value
      redis.call("HSET", REC, id, cmsgpack.pack(rec))
      count = count + 1
    end
  end
  if next_cursor ~= "0" then return false, next_cursor, count end
  add_event(source, value < 0 and "resumed" or "silent", boundary, op[2], count)
  return true, "0", 0
end

local function in_media(media_csv, field)
  if media_csv == "" then return true end
  local medium = string.sub(field, 1, string.find(field, SEP, 1, true) - 1)
  for name in string.gmatch(media_csv, "[^,]+") do
    if name == medium then return true end
  end
  return false
end

local function stored_before(id, bound)
  local packed = redis.call("HGET", REC, id)
  return packed ~= false and cmsgpack.unpack(packed)[7] < bound
end

local function clear_blocks(source, boundary, op, cursor, count)
  local openkey = prefix .. "open:" .. source
  local next_cursor, pairs_ = scan_page(openkey, cursor)
  for i = 1, #pairs_, 2 do
    local field, id = pairs_[i], pairs_[i + 1]
    if in_media(op[2], field) and redis.call("HGET", openkey, field) == id then
      if op[3] < 0 or stored_before(id, op[3]) then
        close_record(id, op[4], op[5])
        redis.call("HDEL", openkey, field)
        count = count + 1
      end
    end
  end
  if next_cursor ~= "0" then return false, next_cursor, count end
  if op[5] == "restart" or op[5] == "restart_presumed" or op[5] == "lost" or op[5] == "reset" then
    add_event(source, op[5], boundary, op[4], count)
  end
  return true, "0", 0
end

local function advance_cursor(source, seq, ts)
  local current = redis.call("HGET", prefix .. "cursors", source)
  if current then
    local c = cmsgpack.unpack(current)
    if ts < c[2] or (ts == c[2] and seq <= c[1]) then return end
  end
  redis.call("HSET", prefix .. "cursors", source, cmsgpack.pack({seq, ts}))
end

local function whole_source_op(source, boundary, op, cursor, count)
  if op[1] == 3 then return clear_blocks(source, boundary, op, cursor, count) end
  return mark_unknown(source, boundary, op, op[1] == 5 and op[2] or -1, cursor, count)
end

-- A whole-source op, or a slice of one: true when it finished (else the cursor and count to carry on from).
-- While it is part done, P..changing names it (`batch`: the batch's seq:ts, so two batches never share a field).
local function source_wide(source, batch, boundary, op, cursor, count)
  local finished, next_cursor, done = whole_source_op(source, boundary, op, cursor, count)
  local field = source .. SEP .. batch
  if finished then
    redis.call("HDEL", prefix .. "changing", field)
  else
    local kind = op[1] == 3 and op[5] or (op[1] == 5 and "silent" or "resumed")
    redis.call("HSET", prefix .. "changing", field, kind)
  end
  return finished, next_cursor, done
end

local function apply_one(source, version, op)
  if op[1] == 1 then open_block(source, version, op)
  elseif op[1] == 2 then close_block(source, op)
  else set_copies(source, op) end
  budget = budget - 1
end

-- progress of a batch applied over several calls: {ops done, HSCAN cursor of the op in hand, its count so far}
local results = {0}
for b = 1, #batches do
  local batch = batches[b]
  local source, seq, ts_text, version, ops = batch[1], batch[2], batch[3], batch[4], batch[5]
  local first, last = batch[6], batch[7]
  local name = source .. ":" .. seq .. ":" .. ts_text
  local marker = prefix .. "applied:" .. name
  results[b + 1] = 0
  if redis.call("EXISTS", marker) == 0 then
    local progress = prefix .. "progress:" .. name
    local saved = redis.call("GET", progress)
    local state = saved and cmsgpack.unpack(saved) or {0, "0", 0}
    if first > state[1] then return redis.error_reply("ledger batch slice out of order: " .. name) end
    local stopped = false
    for o = 1, #ops do
      local index = first + o - 1
      if index >= state[1] then
        if budget <= 0 then
          stopped = true
          break
        end
        local op = ops[o]
        if op[1] == 3 or op[1] == 5 or op[1] == 6 then
          local finished, cursor, count = source_wide(source, seq .. ":" .. ts_text, ts_text, op, state[2],
                                                       state[3])
          state[2], state[3] = cursor, count
          if not finished then
            stopped = true
            break
          end
        else
          apply_one(source, version, op)
        end
        state[1] = index + 1
      end
    end
    if stopped then
      redis.call("SET", progress, cmsgpack.pack(state), "EX", ttl)
      results[1] = b  -- this part and those after it are sent again
      break
    end
    if last == 1 then
      if seq >= 0 then advance_cursor(source, seq, tonumber(ts_text)) end
      redis.call("SET", marker, "1", "EX", ttl)
      redis.call("DEL", progress)
      results[b + 1] = 1
    else
      redis.call("SET", progress, cmsgpack.pack(state), "EX", ttl)
    end
  end
end
write_tallies()
redis.call("INCR", prefix .. "writes")
return results  -- {first part to send again (0: none), then per part 1 when its batch completed now}
"""

BACKFILL_LUA = r"""
-- Once per ledger written before the totals existed: rebuild every total from the records, atomically (the
-- only call that reads every record; Redis serves nothing else meanwhile, so it runs once, at upgrade).
local prefix = ARGV[1]
if redis.call("EXISTS", prefix .. "aggregates") == 1 then return 0 end
""" + TALLY_LUA + r"""
local derived = redis.call("SMEMBERS", prefix .. "aggkeys")
for i = 1, #derived do redis.call("DEL", derived[i]) end
for _, name in ipairs({"tally", "closes", "openby", "closed", "aggkeys"}) do redis.call("DEL", prefix .. name) end
local cursor, count = "0", 0
repeat
  local page = redis.call("HSCAN", REC, cursor, "COUNT", 1000)
  cursor = page[1]
  for i = 1, #page[2], 2 do
    local id, rec = page[2][i], cmsgpack.unpack(page[2][i + 1])
    local unknown_since = rec[12] or -1
    rec[12] = -1
    tally_opened(id, rec[1], rec[5], rec[2], rec[6], rec[7])
    if unknown_since >= 0 then tally_unknown(rec, 1) end
    if rec[8] ~= -1 then
      rec[12] = unknown_since
      tally_closed(id, rec, rec[8], rec[9] ~= "" and rec[9] or "removed")
    end
    count = count + 1
  end
until cursor == "0"
write_tallies()
redis.call("SET", prefix .. "aggregates", "1")
return count
"""

COMPACT_LUA = r"""
-- One bounded slice of compaction: the `limit` closed records removed longest ago, if before `before`. Their
-- totals stay in P..tally, P..closes and the lifetime histograms; the caller calls again until a slice is short.
local prefix = ARGV[1]
local before = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local ids = redis.call("ZRANGEBYSCORE", prefix .. "closed", "-inf", "(" .. ARGV[2], "LIMIT", 0, limit)
for i = 1, #ids do
  redis.call("HDEL", prefix .. "rec", ids[i])
  redis.call("ZREM", prefix .. "closed", ids[i])
end
local current = redis.call("GET", prefix .. "compacted_before")
if not current or before > tonumber(current) then redis.call("SET", prefix .. "compacted_before", ARGV[2]) end
if #ids > 0 then redis.call("INCR", prefix .. "writes") end
return #ids
"""

LIFETIME_STATS_LUA = r"""
-- stats(pair, limit) for one (tenant, medium) pair "tenant\31medium" and its retention (nil for none):
-- {total, p50, p99, longest, outlived} with the lifetimes as "%.17g" text (Lua numbers would come back
-- truncated to integers): the nearest-rank percentiles are the longest lifetime of the 1-second bucket holding
-- the rank, and `outlived` counts the buckets above the retention, as the SQLite store computes them.
local GROUP_S = 256

-- A bucket's longest lifetime is read only for the few buckets an answer comes from (one ZSCORE each), not for
-- every bucket of a group: the group's counts are enough to find them.
local fetched = {}
local function buckets_of(pair, group)
  local cache_key = pair .. "\31" .. group
  if fetched[cache_key] then return fetched[cache_key] end
  local fields = {}
  for second = group * GROUP_S, group * GROUP_S + GROUP_S - 1 do fields[#fields + 1] = tostring(second) end
  local counts = redis.call("HMGET", prefix .. "life:" .. pair, unpack(fields))
  local found = {}
  for i = 1, #counts do
    if counts[i] and tonumber(counts[i]) > 0 then found[#found + 1] = {group * GROUP_S + i - 1, tonumber(counts[i])} end
  end
  fetched[cache_key] = found
  return found
end

local function high(pair, bucket)
  return tonumber(redis.call("ZSCORE", prefix .. "lifehigh:" .. pair, tostring(bucket[1])))
end

local function stats(pair, limit)
  local raw = redis.call("HGETALL", prefix .. "lifegroups:" .. pair)
  local groups, total = {}, 0
  for i = 1, #raw, 2 do
    local count = tonumber(raw[i + 1])
    if count > 0 then
      groups[#groups + 1] = {tonumber(raw[i]), count}
      total = total + count
    end
  end
  if total == 0 then return {0, "0", "0", "0", 0} end
  table.sort(groups, function(a, b) return a[1] < b[1] end)
  -- buckets are whole seconds rounded up, so the longest lifetime is in the highest bucket that has any
  local last = buckets_of(pair, groups[#groups][1])
  local longest = high(pair, last[#last])
  local function ranked(rank)
    local seen = 0
    for _, group in ipairs(groups) do
      if seen + group[2] >= rank then
        for _, bucket in ipairs(buckets_of(pair, group[1])) do
          seen = seen + bucket[2]
          if seen >= rank then return high(pair, bucket) end
        end
      end
      seen = seen + group[2]
    end
    return longest
  end
  local outlived = 0
  if limit then
    local first = math.floor(limit) + 1  -- the first whole second above the retention
    local boundary = math.floor(first / GROUP_S)
    for _, group in ipairs(groups) do
      if group[1] > boundary then
        outlived = outlived + group[2]
      elseif group[1] == boundary then
        for _, bucket in ipairs(buckets_of(pair, group[1])) do
          if bucket[1] > limit then outlived = outlived + bucket[2] end
        end
      end
    end
  end
  local p50 = ranked(math.max(1, math.ceil(0.50 * total)))
  local p99 = ranked(math.max(1, math.ceil(0.99 * total)))
  return {total, string.format("%.17g", p50), string.format("%.17g", p99), string.format("%.17g", longest), outlived}
end
"""

AUDIT_SNAPSHOT_LUA = r"""
-- Read only: everything an unwindowed audit reads, in one atomic call. An apply call changes records, totals
-- and source events together (a silence marks records unknown and records its `silent` event in the same
-- call), so a report built from several separate reads could show the one without the other.
-- ARGV: prefix, tenant, whether the tenant filters ("1") or every tenant is read ("0"), now ("%.17g"),
-- msgpack {tenant: retention_s}, msgpack {source: clock offset_s}.
-- Returns {tally, closes, compacted_before ("" for never), gaps, events, changing, lifetimes, ages}: hashes as
-- HGETALL's flat lists, the events as HVALS; lifetimes as {pair, stats} per (tenant, medium) with a removal;
-- ages as {source\31tenant\31medium, oldest stored_at, count past retention or -1 when none is} per open group.
local prefix = ARGV[1]
local only = ARGV[3] == "1" and ARGV[2] or nil
local now = tonumber(ARGV[4])
local limits = cmsgpack.unpack(ARGV[5])
local offsets = cmsgpack.unpack(ARGV[6])
local SEP = "\31"
""" + LIFETIME_STATS_LUA + r"""
local function split3(field)
  local first = string.find(field, SEP, 1, true)
  local second = string.find(field, SEP, first + 1, true)
  return string.sub(field, 1, first - 1), string.sub(field, first + 1, second - 1), string.sub(field, second + 1)
end

local tally = redis.call("HGETALL", prefix .. "tally")
local closes = redis.call("HGETALL", prefix .. "closes")
local openby = redis.call("HGETALL", prefix .. "openby")
local compacted = redis.call("GET", prefix .. "compacted_before") or ""
local gaps = redis.call("HGETALL", prefix .. "gaps")
local events = redis.call("HVALS", prefix .. "events")
local changing = redis.call("HGETALL", prefix .. "changing")

local removed, order = {}, {}
for i = 1, #tally, 2 do
  local tenant, medium = split3(tally[i])
  if only == nil or tenant == only then
    local pair = tenant .. SEP .. medium
    if removed[pair] == nil then
      removed[pair] = 0
      order[#order + 1] = {pair, tenant}
    end
    removed[pair] = removed[pair] + cmsgpack.unpack(tally[i + 1])[2]
  end
end
local lifetimes = {}
for _, entry in ipairs(order) do
  if removed[entry[1]] > 0 then lifetimes[#lifetimes + 1] = {entry[1], stats(entry[1], limits[entry[2]])} end
end

local ages = {}
for i = 1, #openby, 2 do
  local source, tenant = split3(openby[i])
  if tonumber(openby[i + 1]) > 0 and (only == nil or tenant == only) then
    local key = prefix .. "age:" .. openby[i]
    local oldest = redis.call("ZRANGE", key, 0, 0, "WITHSCORES")
    if #oldest > 0 then
      local source_now = now - (offsets[source] or 0)
      local limit = limits[tenant]
      local overdue = -1
      if limit and source_now - tonumber(oldest[2]) > limit then
        overdue = redis.call("ZCOUNT", key, "-inf", "(" .. string.format("%.17g", source_now - limit))
      end
      ages[#ages + 1] = {openby[i], oldest[2], overdue}
    end
  end
end
return {tally, closes, compacted, gaps, events, changing, lifetimes, ages}
"""

REMEMBER_SALTS_LUA = r"""
local prefix = ARGV[1]
local entries = cmsgpack.unpack(ARGV[2])
for i = 1, #entries do
  if redis.call("SADD", prefix .. "salt_set", entries[i][3]) == 1 then
    redis.call("RPUSH", prefix .. "salts", cmsgpack.pack(entries[i]))
  end
end
return #entries
"""
