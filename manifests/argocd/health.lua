-- Argo CD health check for disagg.dev/DisaggregatedModel.
-- Degraded: the operator says so (Unschedulable, InvalidSpec). Progressing: the operator has
-- not seen this generation yet, a rollout is under way, or no replica is ready yet.
-- Healthy: Ready, and nothing rolling.
local hs = {status = "Progressing", message = "Waiting for the disagg operator"}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local conditions = {}
for _, condition in ipairs(obj.status.conditions) do
  conditions[condition.type] = condition
end
local degraded = conditions["Degraded"]
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = degraded.reason .. ": " .. (degraded.message or "")
  return hs
end
local generation = obj.metadata and obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.message = "Waiting for the operator to reconcile generation " .. generation
  return hs
end
local ready = conditions["Ready"]
local progressing = conditions["Progressing"]
if ready ~= nil and ready.status == "True" then
  if progressing ~= nil and progressing.status == "True" then
    hs.message = "Rolling out: " .. (progressing.message or "")
    return hs
  end
  hs.status = "Healthy"
  hs.message = ready.message or "Ready"
  return hs
end
if ready ~= nil then
  hs.message = ready.message or "Not ready"
end
return hs
