#!/usr/bin/env bash
# CIFAR-10 to 94% on one CUDA GPU with configs/cifar10_fast.yaml: time to the first epoch at
# >= 94% validation accuracy, training images/s, and the final model's test accuracy (the test
# split is used once, after training). Prints the date, GPU, versions and settings beside them,
# then the host syncs of 40 more training steps, by source (benchmarks/host_syncs.py).
#
#   bash benchmarks/gpu_recipe.sh --data-root DIR   # DIR/cifar-10-batches-py/, or DIR/train/<class>/*.jpg
#   bash benchmarks/gpu_recipe.sh --smoke           # CPU, tiny generated images, one epoch: the script works
#   bash benchmarks/gpu_recipe.sh --airbench --data-root DIR   # configs/cifar10_airbench.yaml, in bf16, by
#       benchmarks/compute_to_accuracy.py: its training PFLOPs, time to 94% validation accuracy, test accuracy
#
# Any further options go to `template fit`, e.g. --trainer.max_epochs 12 --model.compile true.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
smoke=false airbench=false data_root="" extra=()
while (($#)); do
  case $1 in
    --smoke) smoke=true ;;
    --airbench) airbench=true ;;
    --data-root) data_root=$2; shift ;;
    *) extra+=("$1") ;;
  esac
  shift
done
if $airbench; then
  exec "$PYTHON" benchmarks/compute_to_accuracy.py --data-root "$data_root" --trainer.precision bf16-mixed "${extra[@]}"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if $smoke; then
  data_root=$work/data
  # 10 classes x 24 training and 6 test images of 32x32, a colour each plus noise.
  "$PYTHON" - "$data_root" <<'EOF'
import sys
from pathlib import Path
import numpy as np
from PIL import Image
rng = np.random.default_rng(0)
for split, count in (("train", 24), ("test", 6)):
    for label in range(10):
        folder = Path(sys.argv[1]) / split / f"class{label}"
        folder.mkdir(parents=True)
        for index in range(count):
            pixels = rng.normal(25 * label, 40, (32, 32, 3)).clip(0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{index}.jpg")
EOF
  extra=(--trainer.accelerator cpu --trainer.precision 32-true --trainer.max_epochs 1 --data.batch_size 32
         --model.net template.nets.ResNetSmall --model.channels_last false "${extra[@]}")
elif [[ -z $data_root ]]; then
  echo "gpu_recipe.sh: give --data-root DIR (CIFAR-10: cifar-10-batches-py/ or train/<class>/ inside), or --smoke" >&2
  exit 2
fi
if [[ -d $data_root/cifar-10-batches-py ]]; then
  data=(--data.root "$data_root")
elif [[ -d $data_root/train ]]; then  # a JPEG/PNG copy in class folders, decoded once into the cache
  data=(--data template.data.ImageFolderDataModule --data.root "$data_root" --data.cache_dir "$work/cache"
        --data.batch_size 512 --data.crop_padding 4 --data.hflip true --data.num_workers 8)
else
  echo "gpu_recipe.sh: $data_root holds neither cifar-10-batches-py/ nor train/<class>/" >&2
  exit 2
fi
quiet=(--trainer.enable_progress_bar false --trainer.enable_model_summary false)
runs=$work/runs

echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "gpu:      $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo none)"
"$PYTHON" -c "import torch, lightning, torchvision; print(f'versions: torch {torch.__version__} (CUDA {torch.version.cuda}), torchvision {torchvision.__version__}, lightning {lightning.__version__}')"
echo "settings: configs/cifar10_fast.yaml ${data[*]} ${extra[*]}"

start=$(date +%s.%N)
"$PYTHON" -m template fit --config configs/cifar10_fast.yaml "${data[@]}" "${quiet[@]}" \
  --trainer.logger.init_args.save_dir "$runs" "${extra[@]}" > "$work/fit.log" 2>&1 || { tail -40 "$work/fit.log"; exit 1; }
end=$(date +%s.%N)
run_dir=$runs/cifar10_fast/version_0
"$PYTHON" -m template test --ckpt_path "$run_dir/checkpoints/last.ckpt" "${data[@]}" "${quiet[@]}" \
  --trainer.logger.init_args.save_dir "$runs" "${extra[@]}" > "$work/test.log" 2>&1 || { tail -40 "$work/test.log"; exit 1; }

"$PYTHON" - "$run_dir/metrics.csv" "$work/test.log" "$start" "$end" <<'EOF'
import csv, re, sys
rows = list(csv.DictReader(open(sys.argv[1])))
elapsed, reached = 0.0, None
for row in rows:
    elapsed += float(row["train/epoch_time"])  # training and validation of the epoch, start-up aside
    if reached is None and float(row["val/acc"]) >= 0.94:
        reached = (int(row["epoch"]) + 1, elapsed)
speed = max(float(row["train/images_per_sec"]) for row in rows)
test = re.search(r"test/acc\D+([\d.]+)", open(sys.argv[2]).read())
print(f"epochs:   {len(rows)}, final val/acc {float(rows[-1]['val/acc']):.4f}")
print("to 94%:   " + (f"{reached[1]:.1f} s of epochs (epoch {reached[0]})" if reached else "not reached"))
print(f"fit:      {float(sys.argv[4]) - float(sys.argv[3]):.1f} s wall, start-up and compile included")
print(f"speed:    {speed:,.0f} training images/s (best epoch)")
print(f"test/acc: {test.group(1) if test else 'not found'} (final model, test split used once)")
EOF

# Every host sync of 40 steps, by source: none should be paid by every step (the dispatch
# probe slows these steps; the figures above are from the fit without it).
"$PYTHON" benchmarks/host_syncs.py --config configs/cifar10_fast.yaml "${data[@]}" "${quiet[@]}" "${extra[@]}" \
  --trainer.max_epochs 1 --trainer.limit_train_batches 40 --trainer.limit_val_batches 1 \
  > "$work/syncs.log" 2>&1 && syncs="none paid by every step" || syncs="SOME PAID BY EVERY STEP (above)"
grep -q "^host syncs over" "$work/syncs.log" || { tail -40 "$work/syncs.log"; exit 1; }
sed -n '/^host syncs over/,$p' "$work/syncs.log"
echo "syncs:    $syncs"
