// The built-in mechanisms of attention/, added to the registry of nn/attention.h when it is
// first used (an explicit call, so the static library always links them in).
#include "attention/lara/lara.h"
#include "attention/nprf_rpe/nprf_rpe.h"
#include "attention/performer/performer.h"
#include "attention/ra/ra.h"

namespace linea::nn::detail {

void register_builtin_attentions(std::map<std::string, AttentionFactory>& factories) {
  factories["performer"] = attn::make_performer;
  factories["ra"] = attn::make_ra;
  factories["lara"] = attn::make_lara;
  factories["nprf_rpe"] = attn::make_nprf_rpe;
}

}  // namespace linea::nn::detail
