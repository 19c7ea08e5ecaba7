"""The handwritten-digits data set behind the embedded models, and a classifier to score samples.

The data are scikit-learn's bundled 8x8 digits (1797 images, pixel values 0..16), so nothing is
downloaded. The diffusion models see them upsampled to 16x16 and scaled to [-1, 1].
"""

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.svm import SVC

NUM_CLASSES = 10
_MAX_PIXEL = 16.0  # sklearn's digits are integers in 0..16


def load_digits_images(size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns sklearn's digits as `images` [N, 1, size, size] float32 in [-1, 1] and `labels` [N] int64."""
    digits = load_digits()
    images = torch.from_numpy(digits.images).float().unsqueeze(1) / _MAX_PIXEL * 2 - 1
    if size != images.shape[-1]:
        images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    return images, torch.from_numpy(digits.target).long()


class DigitClassifier:
    """An RBF SVM fitted on sklearn's 8x8 digits, used to check that generated samples show the requested class.

    It is fitted on a stratified split; `held_out_accuracy` is its accuracy on the remaining `test_size` fraction.
    """

    def __init__(self, test_size: float = 0.2, seed: int = 0):
        digits = load_digits()
        x_train, x_test, y_train, y_test = train_test_split(
            digits.data, digits.target, test_size=test_size, stratify=digits.target, random_state=seed
        )
        # gamma=0.001 is the standard setting for these 0..16 pixel values (its accuracy: docs/benchmarks.md, quality).
        self.svm = SVC(gamma=0.001).fit(x_train, y_train)
        self.held_out_accuracy = float(self.svm.score(x_test, y_test))

    def predict(self, images: torch.Tensor) -> torch.Tensor:
        """Classifies `images` [N, 1, 16, 16] in [-1, 1]; returns the predicted digits [N] as int64."""
        # Approximately undo load_digits_images (2x2 average pooling back to 8x8, rescaling to 0..16); on the
        # held-out real digits this round trip costs about half a point of accuracy. Clamping keeps off-range
        # sample pixels in the SVM's domain.
        images = images.detach().float().cpu().clamp(-1, 1)
        pixels = (F.avg_pool2d(images, 2) + 1) / 2 * _MAX_PIXEL
        features = pixels.flatten(1).numpy().astype(np.float64)
        return torch.from_numpy(self.svm.predict(features)).long()
