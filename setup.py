"""tfdp_sparse: differentially private training of large embedding models."""
import setuptools

with open("requirements.txt") as f:
    _REQUIREMENTS = [l.strip() for l in f if l.strip() and not l.startswith("#")]

setuptools.setup(
    name="tfdp_sparse",
    version="0.1.0",
    description="Sparse differentially private training of embedding models in TensorFlow/Keras",
    packages=setuptools.find_packages(include=["tfdp_sparse*", "models*", "trainers*", "benchmarks*", "experiments*"]),
    python_requires=">=3.11,<3.12",
    install_requires=[r for r in _REQUIREMENTS if not r.startswith("pytest")],
)
