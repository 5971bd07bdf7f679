"""Do published layer-norm observations hold at CPU scale? Post-LN's gradient growth at
initialisation and its need for warm-up (Xiong et al. 2020), and DeepNorm against Post-LN in a
deep stack (Wang et al. 2022), each reported as reproduced or not with its numbers.
"""
