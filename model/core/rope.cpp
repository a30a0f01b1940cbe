#include "model/core/rope.h"

#include <algorithm>
#include <cmath>

namespace quest {

namespace {

// inv_freq[i] = 1 / base^(2i / dim), computed as transformers does: the exponent in fp32, the power in fp32.
std::vector<float> default_inv_freq(double base, int dim) {
    std::vector<float> f(dim / 2);
    for (int i = 0; i < dim / 2; ++i) {
        const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
        const float pos_freq = std::pow(static_cast<float>(base), exponent);
        f[i] = 1.0f / pos_freq;
    }
    return f;
}

double yarn_get_mscale(double scale, double mscale) {
    if (scale <= 1.0) return 1.0;
    return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

RopeFrequencies rope_frequencies(const ModelConfig& c, int seq_len) {
    const int dim = c.head_dim;
    const RopeScaling& r = c.rope;
    RopeFrequencies out;
    switch (r.type) {
        case RopeType::Default:
            out.inv_freq = default_inv_freq(c.rope_theta, dim);
            break;
        case RopeType::Linear:
            out.inv_freq = default_inv_freq(c.rope_theta, dim);
            for (float& f : out.inv_freq) f /= static_cast<float>(r.factor);
            break;
        case RopeType::Dynamic: {
            const double max_pos = c.max_position_embeddings;
            const double len = std::max<double>(seq_len, max_pos);
            const double base =
                c.rope_theta * std::pow((r.factor * len / max_pos) - (r.factor - 1.0), double(dim) / (dim - 2));
            out.inv_freq = default_inv_freq(base, dim);
            break;
        }
        case RopeType::Yarn: {
            const double base = c.rope_theta;
            const double factor = r.factor;
            double attention = 0;
            if (r.attention_factor) {
                attention = *r.attention_factor;
            } else if (r.mscale && r.mscale_all_dim && *r.mscale != 0 && *r.mscale_all_dim != 0) {
                attention = yarn_get_mscale(factor, *r.mscale) / yarn_get_mscale(factor, *r.mscale_all_dim);
            } else {
                attention = yarn_get_mscale(factor, 1.0);
            }
            auto correction_dim = [&](double num_rotations) {
                return (dim * std::log(r.original_max_position_embeddings / (num_rotations * 2 * M_PI))) /
                       (2 * std::log(base));
            };
            double low = correction_dim(r.beta_fast);
            double high = correction_dim(r.beta_slow);
            if (r.truncate) {
                low = std::floor(low);
                high = std::ceil(high);
            }
            low = std::max(low, 0.0);
            high = std::min(high, double(dim - 1));
            if (low == high) high += 0.001;  // transformers: prevent a singular ramp
            out.inv_freq.resize(dim / 2);
            for (int i = 0; i < dim / 2; ++i) {
                const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
                const float pos_freq = std::pow(static_cast<float>(base), exponent);
                const float extrapolation = 1.0f / pos_freq;
                const float interpolation = 1.0f / (static_cast<float>(factor) * pos_freq);
                const float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.0f, 1.0f);
                const float extrapolation_factor = 1.0f - ramp;
                out.inv_freq[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
            }
            out.attention_scaling = static_cast<float>(attention);
            break;
        }
        case RopeType::Llama3: {
            out.inv_freq = default_inv_freq(c.rope_theta, dim);
            const double old_len = r.original_max_position_embeddings;
            const double low_freq_wavelen = old_len / r.low_freq_factor;
            const double high_freq_wavelen = old_len / r.high_freq_factor;
            const float factor = static_cast<float>(r.factor);
            for (float& f : out.inv_freq) {
                const double wavelen = 2 * M_PI / f;
                if (wavelen > low_freq_wavelen) {
                    f = f / factor;  // low frequencies: interpolate fully
                } else if (wavelen >= high_freq_wavelen) {
                    // medium frequencies: blend between interpolated and original
                    const float smooth = static_cast<float>((old_len / wavelen - r.low_freq_factor) /
                                                            (r.high_freq_factor - r.low_freq_factor));
                    f = (1.0f - smooth) * f / factor + smooth * f;
                }  // high frequencies keep their value
            }
            break;
        }
    }
    return out;
}

}  // namespace quest
