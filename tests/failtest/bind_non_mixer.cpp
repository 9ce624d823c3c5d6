// expect: block_or_mixer
// Must not compile: bind<Kind, X> with an X that is neither a block nor a mixer. The diagnostic must name the
// concept (block_or_mixer) at the binding, not an error deep inside the stack.
// Built with -DHYMIX_FAILTEST_CONTROL a real mixer is bound and the file must compile.
#include "hymix/backend/cpu.hpp"
#include "hymix/mixer/mamba2.hpp"
#include "hymix/stack/model.hpp"

namespace {
struct not_a_mixer {
    int d_model = 0;
};
#ifdef HYMIX_FAILTEST_CONTROL
using bound = hymix::mamba2;
#else
using bound = not_a_mixer;
#endif
using stack = hymix::model<hymix::every_layer<hymix::layer_kind::mamba2>, hymix::plain_rms_norm, hymix::no_mlp,
                           hymix::bind<hymix::layer_kind::mamba2, bound>>;
}  // namespace

int main() { return sizeof(stack) > 0 ? 0 : 1; }
